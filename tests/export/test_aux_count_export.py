"""The engines' EAGLE-3 drafts read exactly 3 aux layers: vLLM's Eagle3LlamaForCausalLM builds fc as
target_hidden_size * 3 (no config field changes it), SGLang and TensorRT-LLM likewise. An EAGLE-3 or
P-EAGLE drafter trained on another count is refused at export in one line that says why (issue 18),
instead of writing files the engine cannot load."""
from __future__ import annotations

import pytest

from draftsmith.export import export
from tests.export.conftest import make_checkpoint


@pytest.fixture(scope="module")
def two_aux(tmp_path_factory):
    root = tmp_path_factory.mktemp("two-aux")
    return {"eagle3": make_checkpoint(root / "eagle3", "eagle3", {"ttt_steps": 2, "aux_layer_ids": [1, 3]}),
            "peagle": make_checkpoint(root / "peagle", "peagle", {"num_depths": 2, "aux_layer_ids": [1, 3]})}


@pytest.mark.parametrize("kind, fmt, engine", [("eagle3", "vllm", "vLLM"), ("eagle3", "sglang", "SGLang"),
                                               ("eagle3", "trtllm", "TensorRT-LLM"), ("peagle", "vllm", "vLLM")])
def test_an_aux_count_other_than_3_is_refused(two_aux, kind, fmt, engine, tmp_path):
    with pytest.raises(ValueError) as err:
        export(two_aux[kind], fmt, tmp_path / fmt)
    message = str(err.value)
    assert "\n" not in message and message.startswith("drafter.aux_layer_ids [1, 3]: ")
    assert f"{engine}'s EAGLE-3 draft reads exactly 3 aux layers" in message and "retrain with 3 ids" in message
    assert not (tmp_path / fmt).exists()  # nothing written


def test_block_drafters_take_any_count(two_aux, tmp_path):
    """DFlash's speculators layout writes aux_hidden_state_layer_ids and sizes fc from it: no refusal."""
    ckpt = make_checkpoint(tmp_path / "dflash", "dflash", {"block_size": 3, "num_layers": 1, "aux_layer_ids": [1, 3]})
    result = export(ckpt, "vllm", tmp_path / "out")
    assert result.report["round_trip"]
