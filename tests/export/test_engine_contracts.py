"""Issue 19: what the engines' loaders read from draftsmith's exports, beyond draftsmith's own reading.

Each test names the engine file whose reading it mirrors:
  vLLM >= 0.27  transformers_utils/configs/speculators/algos.py (update_dflash): dflash_config.causal =
                not config.get("sliding_window_non_causal", True); qwen3_dflash.py applies it to every layer
  vLLM 0.27/0.33  P-EAGLE is served as {"method": "eagle3", "parallel_drafting": true}
  vLLM dflash proposer  runs 1 + K queries of the block (K = num_speculative_tokens)
  TensorRT-LLM  Eagle3LlamaDraftModel (older releases) reads midlayer.* only
  SGLang        --dtype auto turns a float32 draft config into float16; TensorRT-LLM builds the draft's
                modules in config.torch_dtype
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import make_checkpoint
from safetensors.torch import load_file, save_file

from draftsmith import checkpoint
from draftsmith.export import EXPORTERS, export
from draftsmith.export.layout import ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export
from draftsmith.report.speedup_model import PROFILE_FILE, PROFILE_SCHEMA


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    out = {}
    for kind, options in {"dflash": {"block_size": 4, "num_layers": 1},
                          "dspark": {"block_size": 4, "num_layers": 1, "markov_rank": 8}}.items():
        path = make_checkpoint(tmp_path_factory.mktemp(kind), kind, options)
        out[kind] = (path, checkpoint.load_drafter(path, device="cpu"))
    return out


@pytest.fixture(scope="module")
def bf16_target_eagle3(tmp_path_factory):
    """EAGLE-3 on a target whose config.json declares bfloat16 (loaded in float32 for training, as on CPU)."""
    root = tmp_path_factory.mktemp("bf16")
    path = make_checkpoint(root, "eagle3", {"ttt_steps": 2})
    config_file = root / "target" / "config.json"
    config = json.loads(config_file.read_text())
    config["dtype"] = "bfloat16"
    config_file.write_text(json.dumps(config))
    return path, checkpoint.load_drafter(path, device="cpu")


def vllm_dflash_causal(config: dict) -> bool:
    """vLLM >= 0.27's reading (algos.py update_dflash)."""
    return not config.get("sliding_window_non_causal", True)


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_vllm_block_export_runs_non_causal_in_vllm(blocks, kind, tmp_path):
    path, loaded = blocks[kind]
    out = export(path, "vllm", tmp_path / "x", loaded=loaded).out_dir
    config = json.loads((out / "config.json").read_text())
    assert config["sliding_window_non_causal"] is True
    assert not vllm_dflash_causal(config)  # the block attends bidirectionally, as trained
    # the gate refuses an export that vLLM would run causally
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    (bad / "config.json").write_text(json.dumps({**config, "sliding_window_non_causal": False}))
    with pytest.raises(ExportValidationError, match="sliding_window_non_causal"):
        validate_export(bad, EXPORTERS.get("vllm")(), loaded, ExportOptions(), 3)


def test_peagle_serve_command_is_eagle3_with_parallel_drafting(tmp_path):
    path = make_checkpoint(tmp_path / "p", "peagle", {"num_depths": 3})
    result = export(path, "vllm", tmp_path / "x")
    spec = json.loads(result.serve_command.split("--speculative-config ", 1)[1].strip("'"))
    assert spec["method"] == "eagle3" and spec["parallel_drafting"] is True  # not draft_model, parallel on
    assert spec["num_speculative_tokens"] == 3
    sidecar = json.loads((result.out_dir / "draftsmith.json").read_text())
    assert sidecar["serve_command"] == result.serve_command


@pytest.mark.parametrize("kind", ["dflash", "dspark"])
def test_block_export_refuses_k_below_one_block(blocks, kind, tmp_path):
    path, loaded = blocks[kind]
    whole = loaded.drafter.tokens_per_round(loaded.drafter.cfg)  # dflash: block_size - 1 (anchor slot); dspark samples from it: 4
    with pytest.raises(ValueError, match=rf"--num-speculative-tokens {whole - 1} .*block_size 4") as err:
        export(path, "vllm", tmp_path / "x", ExportOptions(num_speculative_tokens=whole - 1), loaded=loaded)
    assert "\n" not in str(err.value)  # one line
    assert not (tmp_path / "x").exists()
    export(path, "vllm", tmp_path / "ok", ExportOptions(num_speculative_tokens=whole), loaded=loaded)  # a whole block


def test_block_export_ignores_a_profiles_k_below_one_block(blocks, tmp_path):
    """`draftsmith profile` may recommend a smaller k; vLLM cannot serve it, so the whole block is kept."""
    source, loaded = blocks["dflash"]
    path = tmp_path / "ckpt"
    shutil.copytree(source, path)
    (path / PROFILE_FILE).write_text(json.dumps({"schema": PROFILE_SCHEMA, "recommended_num_speculative_tokens": 1}))
    result = export(path, "vllm", tmp_path / "x")
    config = json.loads((result.out_dir / "config.json").read_text())
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == loaded.drafter.tokens_per_round(loaded.drafter.cfg)


def test_trtllm_eagle3_writes_midlayer_names_and_loads_back(eagle3_ckpt, eagle3_loaded, tmp_path):
    result = export(eagle3_ckpt, "trtllm", tmp_path / "x", loaded=eagle3_loaded)  # the gate's round trip passes
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    assert not any(name.startswith("layers.") for name in tensors)
    assert "midlayer.self_attn.q_proj.weight" in tensors and "midlayer.hidden_norm.weight" in tensors
    # an export written by earlier draftsmith (layers.0.*) still loads back
    old = tmp_path / "old"
    shutil.copytree(result.out_dir, old)
    save_file({k.replace("midlayer.", "layers.0.", 1): v for k, v in tensors.items()}, str(old / "model.safetensors"))
    drafter = EXPORTERS.get("trtllm")().load_back(old, eagle3_loaded)
    assert torch.equal(drafter.midlayer.self_attn.q_proj.weight, tensors["midlayer.self_attn.q_proj.weight"])


@pytest.mark.parametrize("fmt", ["sglang", "trtllm"])
def test_sglang_trtllm_default_to_the_targets_dtype(bf16_target_eagle3, fmt, tmp_path):
    path, loaded = bf16_target_eagle3
    out = export(path, fmt, tmp_path / "x", loaded=loaded).out_dir
    config = json.loads((out / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert load_file(str(out / "model.safetensors"))["fc.weight"].dtype == torch.bfloat16
    out32 = export(path, fmt, tmp_path / "f32", ExportOptions(dtype="float32"), loaded=loaded).out_dir  # --dtype wins
    assert json.loads((out32 / "config.json").read_text())["torch_dtype"] == "float32"


def test_vllm_keeps_the_checkpoints_dtype(bf16_target_eagle3, tmp_path):
    path, loaded = bf16_target_eagle3
    out = export(path, "vllm", tmp_path / "x", loaded=loaded).out_dir
    assert json.loads((out / "config.json").read_text())["torch_dtype"] == "float32"
