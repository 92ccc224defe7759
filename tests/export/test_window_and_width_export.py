"""Sliding-window drafts and a wider EAGLE-3 draft layer in the engine formats (issue 21, items 4 and 5):
the fields vLLM / speculators read (transformer_layer_config.sliding_window, layer_types; head_dim,
num_attention_heads, num_key_value_heads, intermediate_size), the round trip through the validation gate,
speculators' own loader reading them, the validation gate catching a dropped window, and the refusal of
formats whose engine cannot run a window (SGLang, TensorRT-LLM)."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import make_checkpoint
from safetensors.torch import load_file
from test_speculators_load import speculators
from test_validation_failures import problems_of, tampered

from draftsmith.export import export
from draftsmith.heads.draft_layer import KVCache

WIDE = {"num_heads": 8, "num_kv_heads": 2, "head_dim": 16, "intermediate_size": 48}  # target: 4 heads x 8, h 32
CASES = {
    "eagle3_window": ("eagle3", {"draft_vocab_size": 100, "ttt_steps": 3, "sliding_window": 4}),
    "eagle3_wide": ("eagle3", {"draft_vocab_size": 100, "ttt_steps": 3, **WIDE}),
    "dflash_window": ("dflash", {"block_size": 4, "num_layers": 2, "draft_vocab_size": 100, "sliding_window": 5}),
    "dspark_window": ("dspark", {"block_size": 3, "num_layers": 1, "markov_rank": 8, "sliding_window": 6}),
    "peagle_window": ("peagle", {"num_depths": 3, "draft_vocab_size": 100, "sliding_window": 3}),
}


CHECKPOINTS = CASES


def config_of(result) -> dict:
    return json.loads((result.out_dir / "config.json").read_text())


@pytest.mark.parametrize("name,layers", [("eagle3_window", 1), ("dflash_window", 2), ("dspark_window", 1),
                                         ("peagle_window", 1)])
def test_vllm_export_writes_the_window(ckpts, tmp_path, name, layers):
    path, loaded = ckpts[name]
    result = export(path, "vllm", tmp_path / name, loaded=loaded)  # the gate's round trip runs inside
    config = config_of(result)
    lc = config["transformer_layer_config"]
    window = CASES[name][1]["sliding_window"]
    assert lc["sliding_window"] == window and lc["layer_types"] == ["sliding_attention"] * layers
    assert lc["use_sliding_window"] is True
    if "block_size" in config:  # DFlash/DSpark: the windowed layers still run the block non-causally
        assert config["sliding_window_non_causal"] is True
    assert "identical" in result.report["round_trip"]


def test_full_attention_exports_carry_no_window_fields(tmp_path):
    path = make_checkpoint(tmp_path / "c", "dflash", {"block_size": 3, "num_layers": 1})
    lc = config_of(export(path, "vllm", tmp_path / "out"))["transformer_layer_config"]
    assert "sliding_window" not in lc and "layer_types" not in lc and lc["use_sliding_window"] is False


@pytest.mark.parametrize("fmt", ["sglang", "trtllm"])
def test_engines_without_a_draft_window_refuse_it(ckpts, tmp_path, fmt):
    path, loaded = ckpts["eagle3_window"]
    with pytest.raises(ValueError, match=r"drafter.sliding_window=4.*export it with --to vllm"):
        export(path, fmt, tmp_path / fmt, loaded=loaded)
    assert not (tmp_path / fmt).exists() or not any((tmp_path / fmt).iterdir())


def test_validation_catches_a_dropped_window(ckpts, tmp_path):
    path, loaded = ckpts["dflash_window"]
    good = export(path, "vllm", tmp_path / "good", loaded=loaded).out_dir

    def drop(config):
        for key in ("sliding_window", "layer_types"):
            config["transformer_layer_config"].pop(key)
        config["transformer_layer_config"]["use_sliding_window"] = False

    msg = problems_of(tampered(good, tmp_path, edit_config=drop), "vllm", loaded)
    assert "sliding_window is None, the drafter was trained with 5" in msg
    assert "use_sliding_window is false" in msg


@pytest.mark.parametrize("fmt,where", [("vllm", "transformer_layer_config"), ("sglang", None), ("trtllm", None)])
def test_wide_eagle3_layer_in_every_engine_format(ckpts, tmp_path, fmt, where):
    path, loaded = ckpts["eagle3_wide"]
    result = export(path, fmt, tmp_path / fmt, loaded=loaded)
    config = config_of(result)
    fields = config[where] if where else config
    assert (fields["num_attention_heads"], fields["num_key_value_heads"], fields["head_dim"],
            fields["intermediate_size"], fields["hidden_size"]) == (8, 2, 16, 48, 32)
    tensors = load_file(str(result.out_dir / "model.safetensors"))
    prefix = "layers.0." if fmt == "vllm" else "midlayer."
    assert tensors[prefix + "self_attn.q_proj.weight"].shape == (8 * 16, 64)  # heads x head_dim, [emb ; hidden]
    assert tensors[prefix + "self_attn.k_proj.weight"].shape == (2 * 16, 64)
    assert tensors[prefix + "self_attn.o_proj.weight"].shape == (32, 8 * 16)
    assert tensors[prefix + "mlp.gate_proj.weight"].shape == (48, 32)
    assert "identical" in result.report["round_trip"]


def test_speculators_reads_the_window_and_the_wide_layer(ckpts, tmp_path):
    spec = speculators()
    for name in ("dflash_window", "eagle3_window"):
        path, loaded = ckpts[name]
        out = export(path, "vllm", tmp_path / name, loaded=loaded).out_dir
        config = spec.SpeculatorModelConfig.from_pretrained(str(out))
        config.transformer_layer_config._attn_implementation = "sdpa"
        model = spec.SpeculatorModel.from_pretrained(str(out), config=config).eval()
        assert model.sliding_window == CASES[name][1]["sliding_window"]
        assert model.uses_sliding_window_attn and not model.uses_full_attn  # every draft layer windowed
    # the wide EAGLE-3 layer: speculators' own layer computes what draftsmith's does
    path, loaded = ckpts["eagle3_wide"]
    out = export(path, "vllm", tmp_path / "wide", loaded=loaded).out_dir
    config = spec.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = spec.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    d, target = loaded.drafter, loaded.target
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    aux = torch.cat([target.forward(ids).hidden_states[i] for i in d.aux_layer_ids], dim=-1)  # [1, s, 3h]
    positions = torch.arange(9).view(1, -1)
    with torch.no_grad():
        ours = d.logits(d.step(ids[:, 1:], d.fc(aux[:, :9]), positions, cache=KVCache()))  # [1, 9, dv]
        x = torch.cat([model.embed_tokens(ids[:, 1:]), model.fc(aux[:, :9])], dim=-1)  # [1, 9, 2h]
        y = model.layers[0](x, attention_mask=None, position_ids=positions,
                            position_embeddings=model.rotary_emb(x, positions))
        theirs = model.lm_head(model.norm(y[0] if isinstance(y, tuple) else y))
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=1e-4), (ours - theirs).abs().max()


def test_llamacpp_refuses_a_windowed_drafter(ckpts):
    from draftsmith.export.llamacpp.layouts import refusal

    msg = refusal(ckpts["eagle3_window"][1])
    assert msg and "drafter.sliding_window=4" in msg and "--to vllm" in msg
    assert "sliding_window" not in (refusal(ckpts["eagle3_wide"][1]) or "")
