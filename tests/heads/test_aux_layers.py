"""One aux-layer rule for every kind that reads aux_hidden_states (heads/shared.py, issue 18): ids are
unique and ascending (vLLM captures `sorted(set(ids))`, TensorRT-LLM sorts them: a drafter trained on
[3, 1, 2] would be served its features in another order), checked when the recipe loads; and they lie in
0 <= id < num_layers (id i is hidden_states[i], the input of decoder layer i), checked before training."""
from __future__ import annotations

import pytest

from draftsmith import config, testing
from draftsmith.heads import DRAFTERS
from draftsmith.heads.shared import aux_layer_problems, resolve_aux_layer_ids

AUX_KINDS = [k for k in DRAFTERS.names() if "aux_hidden_states" in DRAFTERS.get(k).required_features]


def test_every_aux_kind_is_covered():
    assert set(AUX_KINDS) >= {"eagle3", "dflash", "dspark", "peagle"}


def recipe(kind: str, ids, tmp_path=None) -> dict:
    return {"target": {"path": "unused", "device": "cpu"}, "data": {"path": ["unused.jsonl"]},
            "drafter": {"kind": kind, "aux_layer_ids": ids},
            "train": {"output_dir": str(tmp_path / "run") if tmp_path else "runs/x"},
            "logging": {"progress_bar": False, "report_to": []}}


@pytest.mark.parametrize("kind", AUX_KINDS)
@pytest.mark.parametrize("ids, fixed", [([3, 1, 2], "[1, 2, 3]"), ([1, 1, 2], "[1, 2]")])
def test_unsorted_or_repeated_ids_are_one_config_error(kind, ids, fixed):
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(recipe(kind, ids))
    lines = [line for line in str(err.value).splitlines() if "aux_layer_ids" in line]
    assert len(lines) == 1, str(err.value)
    assert "drafter.aux_layer_ids" in lines[0] and f"write them ascending and unique: {fixed}" in lines[0]


def test_the_rule_itself():
    assert aux_layer_problems(None) == [] and aux_layer_problems([1, 2, 3]) == []
    assert "at least one" in aux_layer_problems([])[0]
    assert resolve_aux_layer_ids([0, 3], 4) == [0, 3]
    with pytest.raises(ValueError, match=r"must lie in 0\.\.3 .*input of decoder layer i"):
        resolve_aux_layer_ids([1, 4], 4)
    assert resolve_aux_layer_ids([1, 4], 4, saved_before_the_rule=True) == [1, 4]  # an old EAGLE-3 checkpoint


@pytest.mark.parametrize("kind", AUX_KINDS)
def test_the_final_state_id_is_refused_before_training_for_every_kind(kind, tmp_path):
    """id == num_layers (EAGLE-3 used to allow it) is refused like any other out-of-range id, before data is read."""
    from draftsmith.train.loop import Trainer

    target = testing.arch_target("llama3")  # 4 layers
    cfg = config.from_dict(recipe(kind, [1, 2, target.num_layers], tmp_path))
    with pytest.raises(ValueError, match=r"drafter\.aux_layer_ids \[1, 2, 4\]: ids must lie in 0\.\.3"):
        Trainer(cfg, target)
    cls = DRAFTERS.get(kind)
    assert cls.feature_layers_for(cls.Config(aux_layer_ids=[1, 2, 3]), target) == [1, 2, 3]
