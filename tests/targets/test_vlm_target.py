"""A vision-language target directory (issue 42) loads whole, as transformers' image-text-to-text class, with
its processor; one without processor files loads for text rows; a processor that does not load is one line.
Qwen2.5-VL / Qwen3-VL are no longer refused at config time."""
from __future__ import annotations

import json

import pytest
import torch

from draftsmith.core.errors import UserError
from draftsmith.targets import archs, load
from draftsmith.testing import vlm


def test_gemma3_vl_directory_loads_with_its_processor(tmp_path):
    torch.set_num_threads(1)
    made = vlm.vlm_target("gemma3-vl")
    vlm.save(made, tmp_path / "t")
    target = load.load(str(tmp_path / "t"), device="cpu")
    assert type(target.model).__name__ == "Gemma3ForConditionalGeneration" and target.processor is not None
    assert target.fingerprint == made.fingerprint
    assert target.num_layers == 4 and target.hidden_size == 32
    assert target.eos_ids == [2]  # the text config's (a VLM config has no top-level eos_token_id)
    from draftsmith.eval import image_workloads

    item = image_workloads.generated(1)[0]
    ids, _, media = image_workloads.encode(item, target)
    again, _, media_again = image_workloads.encode(item, made)
    assert torch.equal(ids, again) and torch.equal(media["pixel_values"], media_again["pixel_values"])
    assert torch.equal(target.forward(ids[None], **media).logits, made.forward(ids[None], **media).logits)


def test_qwen_vl_without_processor_files_loads_for_text(tmp_path):
    made = vlm.vlm_target("qwen2.5-vl")
    made.model.save_pretrained(tmp_path / "t")
    made.tokenizer.save_pretrained(tmp_path / "t")
    target = load.load(str(tmp_path / "t"), device="cpu")
    assert type(target.model).__name__ == "Qwen2_5_VLForConditionalGeneration" and target.processor is None
    (tmp_path / "t" / "preprocessor_config.json").write_text(json.dumps({"image_processor_type": "NoSuchProcessor"}))
    with pytest.raises(UserError) as err:
        load.load(str(tmp_path / "t"), device="cpu")
    assert "its processor" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("name", ["gemma3-vl", "qwen2.5-vl", "qwen3-vl"])
def test_vlm_configs_are_not_refused(name):
    assert archs.config_refusals(archs.TINY[name][1]()) == []
