"""train.init_from accepts a `draftsmith export` directory as well as a checkpoint (issue 11, item 16)."""
from __future__ import annotations

import pytest
import torch

from draftsmith.export.api import export
from draftsmith.heads import DRAFTERS
from draftsmith.train import checkpoint


@pytest.mark.parametrize("fmt", ["vllm", "trtllm"])
def test_init_from_export_dir_restores_the_trained_weights(eagle3_loaded, tmp_path, fmt):
    out = export(None, fmt, tmp_path / fmt, loaded=eagle3_loaded, validate=False).out_dir
    loaded = eagle3_loaded
    fresh = DRAFTERS.get("eagle3").from_target(loaded.config.drafter.options, loaded.target,
                                               torch.arange(loaded.target.vocab_size))  # another draft vocab
    trained = loaded.drafter.state_dict_for_export()
    assert any(not torch.equal(v, fresh.state_dict()[k]) for k, v in trained.items())
    checkpoint.load_init_weights(out, fresh, loaded.target)
    for key, value in trained.items():
        assert torch.equal(fresh.state_dict()[key], value), key


def test_init_from_refuses_an_unrelated_dir_and_another_kind(eagle3_loaded, tmp_path):
    with pytest.raises(FileNotFoundError, match="neither a checkpoint"):
        checkpoint.load_init_weights(tmp_path, eagle3_loaded.drafter, eagle3_loaded.target)
    out = export(None, "vllm", tmp_path / "v", loaded=eagle3_loaded, validate=False).out_dir
    other = DRAFTERS.get("medusa").from_target(DRAFTERS.get("medusa").Config(num_heads=2), eagle3_loaded.target)
    with pytest.raises(ValueError, match="holds a eagle3 drafter"):
        checkpoint.load_init_weights(out, other, eagle3_loaded.target)
