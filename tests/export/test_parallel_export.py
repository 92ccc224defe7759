"""Parallel drafters (DFlash, ...) exported in the speculators format for vLLM: exact tensor sets and
shapes, config fields, the validation gate's round trip, a load in the installed speculators package
with a forward equal to draftsmith's within 1e-5, and clear refusals where an engine cannot serve."""
from __future__ import annotations

import json

import pytest
import torch
from conftest import LLAMA3_ROPE
from safetensors.torch import load_file
from test_speculators_load import speculators

from draftsmith.export import export
from draftsmith.export.layout import ExportOptions

CASES = {
    "dflash": ("dflash", {"block_size": 4, "num_layers": 2, "draft_vocab_size": 100}),
    "dflash_full": ("dflash", {"block_size": 3, "num_layers": 1}),
    "peagle": ("peagle", {"num_depths": 4, "draft_vocab_size": 100}),
    "dspark": ("dspark", {"block_size": 4, "num_layers": 1, "markov_rank": 8, "draft_vocab_size": 100}),
}


CHECKPOINTS = {name: (kind, options, {"rope": LLAMA3_ROPE, "max_positions": 4096} if name == "dflash" else {})
               for name, (kind, options) in CASES.items()}


@pytest.fixture(scope="module")
def exported(ckpts, tmp_path_factory):
    root = tmp_path_factory.mktemp("exports")
    return {name: export(path, "vllm", root / name, loaded=loaded) for name, (path, loaded) in ckpts.items()}


def read(result):
    return json.loads((result.out_dir / "config.json").read_text()), load_file(str(result.out_dir / "model.safetensors"))


def test_dflash_config_and_tensors(exported, ckpts):
    config, tensors = read(exported["dflash"])
    d = ckpts["dflash"][1].drafter
    assert config["speculators_model_type"] == "dflash" and config["architectures"] == ["DFlashSpeculator"]
    assert config["block_size"] == 4 and config["sample_from_anchor"] is False
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 3  # B - 1
    assert config["aux_hidden_state_layer_ids"] == d.aux_layer_ids and config["mask_token_id"] == d.mask_token_id
    lc = config["transformer_layer_config"]
    assert lc["model_type"] == "qwen3" and lc["num_hidden_layers"] == 2
    assert lc["rope_scaling"]["rope_type"] == "llama3" and lc["max_position_embeddings"] == 4096
    layer = {n.removeprefix("layers.1.") for n in tensors if n.startswith("layers.1.")}
    assert layer == {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
                     "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                     "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight",
                     "mlp.up_proj.weight", "mlp.down_proj.weight"}
    assert {n for n in tensors if not n.startswith("layers.")} == {
        "fc.weight", "hidden_norm.weight", "norm.weight", "lm_head.weight", "embed_tokens.weight", "d2t", "t2d"}
    assert tensors["lm_head.weight"].shape == (100, 32) and tensors["fc.weight"].shape == (32, 96)
    assert "3 contexts x 3 tokens identical" in exported["dflash"].report["round_trip"]
    assert '"method": "dflash"' in exported["dflash"].serve_command
    _, full = read(exported["dflash_full"])
    assert "d2t" not in full and "t2d" not in full  # speculators has no vocab-map buffers at full vocabulary


def test_refusals(ckpts, tmp_path):
    path, loaded = ckpts["dflash"]
    with pytest.raises(ValueError, match=r"exceeds what one dflash block drafts \(3"):
        export(path, "vllm", tmp_path / "k", ExportOptions(num_speculative_tokens=5), loaded=loaded)
    with pytest.raises(ValueError, match="--to hf does not take dflash drafters.*formats for dflash: \\['llama.cpp', 'sglang', 'vllm'\\]"):
        export(path, "hf", tmp_path / "hf", loaded=loaded)
    with pytest.raises(ValueError, match="TensorRT-LLM's DFlash drafter .* pre-releases"):
        export(path, "trtllm", tmp_path / "trtllm", loaded=loaded)
    with pytest.raises(ValueError, match="--to sglang: this dflash drafter has a reduced draft vocabulary"):
        export(path, "sglang", tmp_path / "sglang", loaded=loaded)  # SGLang borrows the target's lm_head
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["dflash", "dflash_full", "dspark"])
def test_speculators_loads_and_matches(exported, ckpts, name):
    spec = speculators()
    out = exported[name].out_dir
    config = spec.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "sdpa"  # flex attention has no CPU path here
    model = spec.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    saved = set(load_file(str(out / "model.safetensors")))
    own = {k for k in model.state_dict() if not k.startswith("verifier_")}
    assert saved == own, f"speculators expects {sorted(own - saved)} more / {sorted(saved - own)} fewer"
    loaded = ckpts[name][1]
    d, target = loaded.drafter, loaded.target
    ids = torch.randint(3, target.vocab_size, (1, 11), generator=torch.Generator().manual_seed(0))
    n = 8  # context x_0..x_7 committed; the block is anchored at x_7 (position 7)
    aux = torch.cat([target.forward(ids[:, : n - 1]).hidden_states[i] for i in d.aux_layer_ids], dim=-1)
    with torch.no_grad():
        ours = _draftsmith_block(d, aux, ids, n)
        ctx = model.hidden_norm(model.fc(aux))  # [1, n-1, h]
        block = torch.full((1, d.block_size), d.mask_token_id)
        block[0, 0] = ids[0, n - 1]
        x = model.embed_tokens(block)
        pos = torch.arange(n - 1 + d.block_size).view(1, -1)
        pe = model.rotary_emb(x, pos)
        for layer in model.layers:
            x = layer(hidden_states=x, target_hidden=ctx, attention_mask=None, position_ids=pos, position_embeddings=pe)
        hidden = model.norm(x)
        theirs = model.lm_head(hidden)[0]
        if name == "dspark":  # + the Markov bias and the confidence on the same previous tokens
            prev = torch.cat([block[:, :1], ids[:, n : n + d.block_size - 1]], dim=1)  # [1, B]
            ours_h = _draftsmith_hidden(d, aux, ids, n)
            ours, ours_c = d.heads(ours_h, prev[0])
            emb = model.markov_head.prev_embeddings(prev)
            theirs = theirs + model.markov_head.block_bias(prev_token_ids=prev, hidden_states=hidden, prev_emb=emb)[0]
            theirs_c = model.confidence_head(torch.cat([hidden, emb], dim=-1))[0]
            assert torch.allclose(ours_c, theirs_c, atol=1e-5, rtol=0), (ours_c - theirs_c).abs().max()
            assert config.sample_from_anchor is True and config.markov_rank == 8
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()
    if "d2t" in saved:
        assert torch.equal(model.d2t, d.d2t) and torch.equal(model.t2d, d.t2d)


def _draftsmith_block(d, aux, ids, n):
    """draftsmith's proposer path: context K/V of positions < n-1, one block forward -> [B, dv]."""
    return d.lm_head(_draftsmith_hidden(d, aux, ids, n))


def _draftsmith_hidden(d, aux, ids, n):
    from draftsmith.heads.block import BlockProposer

    prop = BlockProposer(d, type("T", (), {"vocab_size": d.t2d.shape[0]})())
    prop.begin(ids[0, :n])
    prop.ctx_kv = d.context_kv(d.context(aux), torch.arange(n - 1).view(1, -1))
    prop.committed = n - 1
    return prop.block_hidden(ids[0, :n])  # [B, h]


def test_peagle_config_and_tensors(exported, ckpts):
    config, tensors = read(exported["peagle"])
    d = ckpts["peagle"][1].drafter
    assert config["speculators_model_type"] == "peagle" and config["architectures"] == ["PEagleSpeculator"]
    assert config["speculators_config"]["algorithm"] == "peagle" and config["mask_token_id"] == d.mask_token_id
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    assert tensors["mask_hidden"].shape == (1, 1, 96)
    assert torch.equal(tensors["embed_tokens.weight"], d.embed_tokens.weight)  # its own trained copy
    assert not torch.equal(tensors["embed_tokens.weight"], ckpts["peagle"][1].target.embed_tokens.weight)
    # vLLM 0.27 / 0.33 serve P-EAGLE as method eagle3 with parallel_drafting: without a method it picks
    # draft_model and leaves parallel_drafting off (issue 19, problem 2)
    spec = json.loads(exported["peagle"].serve_command.split("--speculative-config ", 1)[1].strip("'"))
    assert spec["method"] == "eagle3" and spec["parallel_drafting"] is True
    with pytest.raises(ValueError, match="num_depths = 4"):
        export(ckpts["peagle"][0], "vllm", exported["peagle"].out_dir.parent / "k9",
               ExportOptions(num_speculative_tokens=9), loaded=ckpts["peagle"][1])


def test_speculators_loads_peagle_and_matches(exported, ckpts):
    spec = speculators()
    out = exported["peagle"].out_dir
    config = spec.SpeculatorModelConfig.from_pretrained(str(out))
    config.transformer_layer_config._attn_implementation = "sdpa"
    model = spec.SpeculatorModel.from_pretrained(str(out), config=config).eval()
    saved = set(load_file(str(out / "model.safetensors")))
    own = {k for k in model.state_dict() if not k.startswith("verifier_")}
    assert saved == own, f"speculators expects {sorted(own - saved)} more / {sorted(saved - own)} fewer"
    loaded = ckpts["peagle"][1]
    d, target = loaded.drafter, loaded.target
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(0))
    n, k = 8, 4  # newest real pair a = 6 = (h_6, x_7); depths 1..3 are placeholders at positions 7..9
    aux = torch.cat([target.forward(ids[:, : n - 1]).hidden_states[i] for i in d.aux_layer_ids], dim=-1)
    with torch.no_grad():
        prop = d.make_proposer(target)
        prop.begin(ids[0, :n])
        prop.commit(ids[0, :n], n - 1, target.forward(ids[:, : n - 1]))
        ours = prop.parallel_logits(k)  # [k, dv]
        feats = torch.cat([aux, model.mask_hidden.expand(1, k - 1, -1)], dim=1)  # [1, n-1+k-1, n*h]
        tokens = torch.cat([ids[:, 1:n], torch.full((1, k - 1), config.mask_token_id)], dim=1)
        x = torch.cat([model.embed_tokens(tokens), model.fc(feats)], dim=-1)  # [1, L, 2h]
        pos = torch.arange(x.shape[1]).view(1, -1)
        y = model.layers[0](x, attention_mask=None, position_ids=pos, position_embeddings=model.rotary_emb(x, pos))
        y = y[0] if isinstance(y, tuple) else y
        theirs = model.lm_head(model.norm(y))[0, -k:]  # causal attention = the P-EAGLE mask for one chain
    assert torch.allclose(ours, theirs, atol=1e-5, rtol=0), (ours - theirs).abs().max()
    assert torch.equal(model.d2t, d.d2t) and torch.equal(model.mask_hidden, d.mask_hidden)


def test_dspark_config_and_refusals(exported, ckpts, tmp_path):
    config, tensors = read(exported["dspark"])
    assert config["speculators_model_type"] == "dspark" and config["architectures"] == ["DSparkSpeculator"]
    assert config["sample_from_anchor"] is True and config["markov_rank"] == 8
    assert config["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4  # every slot drafts
    assert tensors["markov_head.markov_w1.weight"].shape == (259, 8)
    assert tensors["markov_head.markov_w2.weight"].shape == (100, 8)
    assert tensors["confidence_head.proj.weight"].shape == (1, 40)
    with pytest.raises(ValueError, match="--to sglang: this dspark drafter has a reduced draft vocabulary"):
        export(ckpts["dspark"][0], "sglang", tmp_path / "s", loaded=ckpts["dspark"][1])
