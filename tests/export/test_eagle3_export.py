"""EAGLE-3 export to SGLang, vLLM (speculators) and TensorRT-LLM: files, names, config keys as
the issue lists them, rope carried from the target, validation gate and round trip."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith.export import export
from draftsmith.export.layout import ExportOptions

LAYER = ["hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
         "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
         "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
COMMON = {"fc.weight", "norm.weight", "lm_head.weight", "d2t"}
EXPECTED_TENSORS = {
    "sglang": COMMON | {"t2d"} | {f"midlayer.{n}" for n in LAYER},
    "vllm": COMMON | {"t2d", "embed_tokens.weight"} | {f"layers.0.{n}" for n in LAYER},
    "trtllm": COMMON | {f"midlayer.{n}" for n in LAYER},  # Model Optimizer's names (issue 19)
}


@pytest.fixture(scope="module")
def exports(eagle3_ckpt, eagle3_loaded, tmp_path_factory):
    out = tmp_path_factory.mktemp("exports")
    return {fmt: export(eagle3_ckpt, fmt, out / fmt, loaded=eagle3_loaded) for fmt in EXPECTED_TENSORS}


@pytest.mark.parametrize("fmt", sorted(EXPECTED_TENSORS))
def test_tensor_names_shapes_and_round_trip(exports, eagle3_loaded, fmt):
    result = exports[fmt]
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    assert set(tensors) == EXPECTED_TENSORS[fmt]
    d = eagle3_loaded.drafter
    h = d.layer_config.hidden_size
    assert tuple(tensors["fc.weight"].shape) == (h, 3 * h)
    assert tuple(tensors["lm_head.weight"].shape) == (100, h)
    q = [k for k in tensors if k.endswith("q_proj.weight")][0]
    assert tensors[q].shape[1] == 2 * h  # attention input is [emb ; hidden]
    assert tensors["d2t"].dtype == torch.int64 and torch.equal(tensors["d2t"], d.d2t)
    if "t2d" in tensors:
        assert tensors["t2d"].dtype == torch.bool
        assert torch.equal(torch.nonzero(tensors["t2d"]).flatten(), tensors["d2t"] + torch.arange(100))
    assert result.report["round_trip"] == "3 contexts x 3 tokens identical"
    assert not any(p.name.startswith(".") for p in result.out_dir.parent.iterdir())  # no temp dirs left


def _llama(fmt, config):
    return config["transformer_layer_config"] if fmt == "vllm" else config


@pytest.mark.parametrize("fmt", sorted(EXPECTED_TENSORS))
def test_rope_and_positions_carried_from_target(exports, fmt):
    config = json.loads((exports[fmt].out_dir / "config.json").read_text())
    llama = _llama(fmt, config)
    assert llama["max_position_embeddings"] == 4096
    assert llama["rope_theta"] == 500000.0
    assert llama["rope_scaling"]["rope_type"] == "llama3" and llama["rope_scaling"]["factor"] == 8.0
    side = json.loads((exports[fmt].out_dir / "draftsmith.json").read_text())
    for key in ("name", "architectures", "vocab_size", "hidden_size"):
        assert key in side["verifier"]
    assert side["verifier"]["vocab_size"] == 259 and side["verifier"]["hidden_size"] == 32


def test_sglang_config_keys(exports, eagle3_loaded):
    config = json.loads((exports["sglang"].out_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["draft_vocab_size"] == 100 and config["vocab_size"] == 259
    assert config["tie_word_embeddings"] is False
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rms_norm_eps", "num_hidden_layers"):
        assert key in config
    # SGLang's ids name layer outputs (it adds 1): draftsmith's ids minus one
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in eagle3_loaded.drafter.aux_layer_ids]
    assert "--speculative-algorithm EAGLE3 --speculative-draft-model-path" in exports["sglang"].serve_command


def test_vllm_speculators_config_keys(exports, eagle3_loaded):
    config = json.loads((exports["vllm"].out_dir / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["architectures"] == ["Eagle3Speculator"]
    assert config["draft_vocab_size"] == 100
    assert config["norm_before_residual"] is False  # vLLM defaults a missing one to true
    assert config["target_hidden_size"] == 32
    assert config["eagle_aux_hidden_state_layer_ids"] == eagle3_loaded.drafter.aux_layer_ids
    assert config["transformer_layer_config"]["model_type"] == "llama"
    spec = config["speculators_config"]
    assert spec["algorithm"] == "eagle3" and spec["default_proposal_method"] == "greedy"
    assert spec["proposal_methods"][0]["proposal_type"] == "greedy"
    assert spec["proposal_methods"][0]["speculative_tokens"] == 3
    assert set(spec["verifier"]) == {"architectures", "name_or_path"}
    assert spec["verifier"]["architectures"] == ["LlamaForCausalLM"]
    cmd = exports["vllm"].serve_command
    assert cmd.startswith("vllm serve ") and '"method": "eagle3"' in cmd and "--speculative-config" in cmd


def test_trtllm_config_keys(exports, eagle3_loaded):
    out = exports["trtllm"].out_dir
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    eagle = config["eagle_config"]
    want = [i - 1 for i in eagle3_loaded.drafter.aux_layer_ids]
    assert eagle["eagle_aux_hidden_state_layer_ids"] == want and eagle["use_aux_hidden_state"] is True
    yaml_text = (out / "extra_llm_api_options.yaml").read_text()
    spec = __import__("yaml").safe_load(yaml_text)["speculative_config"]
    assert spec["decoding_type"] == "Eagle3" and spec["speculative_model"] == str(out)
    assert "extra_llm_api_options.yaml" in exports["trtllm"].serve_command


def test_bf16_export_round_trips(eagle3_ckpt, eagle3_loaded, tmp_path):
    result = export(eagle3_ckpt, "sglang", tmp_path / "bf16", ExportOptions(dtype="bfloat16"), loaded=eagle3_loaded)
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    assert tensors["fc.weight"].dtype == torch.bfloat16 and tensors["d2t"].dtype == torch.int64
    assert json.loads((result.out_dir / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert result.report["round_trip"].endswith("identical")


def test_cli_prints_serving_command(eagle3_ckpt, tmp_path, capsys):
    from draftsmith.cli import main

    assert main(["export", str(eagle3_ckpt), "--to", "vllm", "--out", str(tmp_path / "v")]) == 0
    out = capsys.readouterr().out
    assert "vllm serve" in out and "validated" in out
    assert main(["export", str(eagle3_ckpt), "--to", "vllm", "--out", str(tmp_path / "v")]) == 2  # not empty
    assert main(["export", str(eagle3_ckpt), "--to", "hf", "--out", str(tmp_path / "h")]) == 2  # wrong kind
    assert not (tmp_path / "h").exists()
