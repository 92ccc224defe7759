"""Target loading facts: the aux-layer rule, stop ids, display names, frozen parameters."""
from __future__ import annotations

import pytest

from draftsmith.targets import archs
from draftsmith.targets import load as target_mod
from tests.conftest import STORIES, shared_path


@pytest.mark.parametrize("layers, ids", [(32, [2, 16, 29]), (7, [2, 3, 4]), (6, [1, 3, 5]), (5, [1, 2, 4]),
                                         (4, [1, 2, 3]), (3, [0, 1, 2]), (2, [0, 1, 1])])
def test_default_aux_layer_ids(layers, ids):
    assert archs.default_aux_layer_ids(layers) == ids


def test_stories260k_is_frozen_with_both_stop_ids():
    t = target_mod.load(str(shared_path(STORIES)))
    assert t.eos_ids == [2, 1]  # it ends a story with BOS
    assert all(not p.requires_grad for p in t.model.parameters()) and not t.model.training
    assert t.name == "stories260K-hf" and t.identity()["path"].endswith("stories260K-hf")
    assert len(t.forward(t.tokenizer("Once upon a time", return_tensors="pt").input_ids).hidden_states) == 6


def test_builtin_target_and_unknown_builtin():
    assert target_mod.display_name("builtin:pycode-tiny") == "builtin:pycode-tiny"
    with pytest.raises(FileNotFoundError, match="no embedded target 'nope'.*build_pycode_target"):
        target_mod.resolve_path("builtin:nope")
