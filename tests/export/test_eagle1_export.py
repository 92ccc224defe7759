"""EAGLE-1 export for vLLM (model_executor/models/llama_eagle.py, 0.9.2-0.33.0) and SGLang 0.5.23
(srt/models/llama_eagle.py): the files, the round trip, and the engines' own forward rebuilt from the files
alone (fc over [embedding ; post-norm feature], a Llama layer whose input norm is the identity, no final
norm, the target's embedding and lm_head) compared with draftsmith's drafter."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import LLAMA3_ROPE
from safetensors.torch import load_file
from torch import nn

from draftsmith.export import EXPORTERS, export, refusals
from draftsmith.export.layout import ExportOptions, ExportValidationError
from draftsmith.export.validate import validate_export
from tests.export.tamper import tampered_copy

LAYER = ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
         "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight"]
TENSORS = {"vllm": {"fc.weight", *(f"layers.0.{n}" for n in LAYER)},
           "sglang": {"fc.weight", "fc.bias", *(f"layers.0.{n}" for n in LAYER)}}
ARCH = {"vllm": ["EagleLlamaForCausalLM"], "sglang": ["LlamaForCausalLMEagle"]}


# EAGLE-1 without (vLLM's fc) and with (the default) a trained fc bias, on a llama3-rope target
CHECKPOINTS = {bias: ("eagle1", {"fc_bias": bias}, {"rope": LLAMA3_ROPE, "max_positions": 4096})
               for bias in (False, True)}


@pytest.fixture(scope="module")
def exported(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("eagle1-exports")
    out = {(fmt, False): export(ckpts[False][0], fmt, root / f"{fmt}-0", loaded=ckpts[False][1])
           for fmt in ("vllm", "sglang")}
    out[("sglang", True)] = export(ckpts[True][0], "sglang", root / "sglang-1", loaded=ckpts[True][1])
    return out


@pytest.mark.parametrize("fmt", ["vllm", "sglang"])
def test_files_rope_and_round_trip(exported, ckpts, fmt):
    result, loaded = exported[(fmt, False)], ckpts[False][1]
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    config = json.loads((result.out_dir / "config.json").read_text())
    assert set(tensors) == TENSORS[fmt]  # no input_layernorm, no final norm, no embed_tokens / lm_head
    h = loaded.target.hidden_size
    assert tuple(tensors["fc.weight"].shape) == (h, 2 * h)
    assert config["architectures"] == ARCH[fmt] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["vocab_size"] == loaded.target.vocab_size
    assert config["hidden_act"] == "silu" and config["attention_bias"] is False and config["mlp_bias"] is False
    assert config["rope_theta"] == 500000.0 and config["rope_scaling"]["rope_type"] == "llama3"
    assert config["max_position_embeddings"] == 4096
    assert result.report["round_trip"] == "3 contexts x 5 tokens identical"
    if fmt == "sglang":  # SGLang's fc has a bias: a bias-free drafter's is written as zeros
        assert torch.equal(tensors["fc.bias"], torch.zeros(h))


def test_serve_commands(exported):
    vllm_cmd = exported[("vllm", False)].serve_command
    assert vllm_cmd.startswith("vllm serve ") and '"method": "eagle"' in vllm_cmd and '"num_speculative_tokens": 5' in vllm_cmd
    sglang_cmd = exported[("sglang", False)].serve_command
    assert "--speculative-algorithm EAGLE --speculative-draft-model-path" in sglang_cmd
    assert "--speculative-num-steps 5 --speculative-eagle-topk 1 --speculative-num-draft-tokens 6" in sglang_cmd


def engine_forward(export_dir, target, ids: torch.Tensor, input_norm: bool = False) -> torch.Tensor:
    """What vLLM's / SGLang's EAGLE-1 computes from the export's files alone: fc([embed(x_{j+1}) ; f_j]) with f the
    target's post-norm final state, one Llama layer whose input_layernorm is the identity, output hidden +
    residual with no final norm. Built from transformers' Llama layer and the files, not from draftsmith."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    cfg = LlamaConfig.from_pretrained(str(export_dir))
    cfg._attn_implementation = "eager"
    tensors = {k: v.float() for k, v in load_file(str(export_dir / "model.safetensors")).items()}
    layer = LlamaDecoderLayer(cfg, layer_idx=0).eval()
    if not input_norm:  # both engines delete layer 0's input norm (input_norm=True: an engine that kept it)
        layer.input_layernorm = nn.Identity()
    missing, unexpected = layer.load_state_dict(
        {k[len("layers.0."):]: v for k, v in tensors.items() if k.startswith("layers.0.")}, strict=False)
    assert not unexpected and set(missing) <= ({"input_layernorm.weight"} if input_norm else set())
    fc = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias="fc.bias" in tensors)
    fc.load_state_dict({k[3:]: v for k, v in tensors.items() if k.startswith("fc.")})
    with torch.no_grad():
        feats = target.forward(ids).hidden_states[-1]  # [1, s, h] the post-norm state the engines pass
        x = fc(torch.cat([target.embed_tokens(ids[:, 1:]), feats[:, :-1]], dim=-1))  # [1, n, 2h] -> [1, n, h]
        n = x.shape[1]
        pos = torch.arange(n).view(1, -1)
        mask = torch.full((n, n), float("-inf")).triu(1).view(1, 1, n, n)  # causal
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=LlamaRotaryEmbedding(cfg)(x, pos))
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("fmt,bias", [("vllm", False), ("sglang", False), ("sglang", True)])
def test_the_engines_forward_from_the_files_equals_the_drafter(exported, ckpts, fmt, bias):
    loaded = ckpts[bias][1]
    target, drafter = loaded.target, loaded.drafter
    ids = torch.randint(3, target.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        feats = target.forward(ids).hidden_states[-1]
        want = drafter.step(ids[:, 1:], feats[:, :-1], torch.arange(11).view(1, -1))  # [1, 11, h]
    got = engine_forward(exported[(fmt, bias)].out_dir, target, ids)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the comparison is sensitive to the convention: a layer that kept its input norm computes something else
    assert not torch.allclose(engine_forward(exported[(fmt, bias)].out_dir, target, ids, input_norm=True), want,
                              atol=1e-3)


def test_vllm_refuses_a_trained_fc_bias_and_sglang_takes_it(ckpts, exported, tmp_path):
    path, loaded = ckpts[True]
    with pytest.raises(ValueError, match=r"fc has a trained bias.*llama_eagle\.py.*drafter\.fc_bias=false"):
        export(path, "vllm", tmp_path / "v", loaded=loaded)
    assert not (tmp_path / "v").exists()
    tensors = load_file(str(exported[("sglang", True)].out_dir / "model.safetensors"))
    assert torch.equal(tensors["fc.bias"], loaded.drafter.fc.bias.detach())


def copy_with(result, tmp_path, edit_config=None, edit_tensors=None):
    return tampered_copy(result.out_dir, tmp_path / "copy", edit_tensors, edit_config)


def problems(directory, fmt, loaded) -> str:
    with pytest.raises(ExportValidationError) as err:
        validate_export(directory, EXPORTERS.get(fmt)(), loaded, ExportOptions(), 2)
    return str(err.value)


def test_gate_checks_the_fields_the_loaders_read(exported, ckpts, tmp_path):
    loaded = ckpts[False][1]

    def edit(config):
        config.update(architectures=["LlamaForCausalLM"], attention_bias=True, num_hidden_layers=2)

    msg = problems(copy_with(exported[("vllm", False)], tmp_path, edit_config=edit), "vllm", loaded)
    for key in ("architectures", "attention_bias", "num_hidden_layers"):
        assert f"config.json: {key} is" in msg


def test_gate_catches_extra_tensors_and_a_nonzero_bias_for_a_bias_free_drafter(exported, ckpts, tmp_path):
    loaded = ckpts[False][1]
    h = loaded.target.hidden_size

    def add_norm_and_bias(tensors):
        tensors["layers.0.input_layernorm.weight"] = torch.ones(h)  # vLLM's loader has no such parameter
        tensors["fc.bias"] = torch.ones(h)

    msg = problems(copy_with(exported[("vllm", False)], tmp_path, edit_tensors=add_norm_and_bias), "vllm", loaded)
    assert "unexpected tensor(s) ['fc.bias', 'layers.0.input_layernorm.weight']" in msg

    def nonzero_bias(tensors):
        tensors["fc.bias"] = torch.ones(h)

    msg = problems(copy_with(exported[("sglang", False)], tmp_path / "s", edit_tensors=nonzero_bias), "sglang", loaded)
    assert "fc.bias is not zero" in msg


def test_a_non_silu_target_is_refused():
    from transformers import LlamaConfig

    gelu = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
                       vocab_size=259, hidden_act="gelu")
    for fmt in ("vllm", "sglang"):
        assert any("SiLU only" in r for r in refusals(gelu, "eagle1", fmt))
    assert refusals(LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=4), "eagle1", "vllm") == []


def test_cli_exports_eagle1(ckpts, tmp_path, capsys):
    from draftsmith.cli import main

    path, _ = ckpts[False]
    assert main(["export", str(path), "--to", "vllm", "--out", str(tmp_path / "v"), "--engine-version", "0.27"]) == 0
    out = capsys.readouterr().out
    assert "validated" in out and '"method": "eagle"' in out
    assert json.loads((tmp_path / "v" / "draftsmith.json").read_text())["engine_version"] == "0.27.0"
