"""EAGLE 3.1 options (norm_before_residual, fc_norm, norm_output) through export: vLLM's speculators
format carries them and speculators' own model computes what draftsmith's drafter computes; SGLang
and TensorRT-LLM carry fc_norm / norm_output and refuse norm_before_residual, which they cannot run."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from draftsmith import checkpoint
from draftsmith.export import export
from tests.export.conftest import make_checkpoint
from tests.export.test_speculators_load import speculators

ALL_ON = {"draft_vocab_size": 100, "ttt_steps": 3, "norm_before_residual": True, "fc_norm": True, "norm_output": True}
NO_NBR = {**ALL_ON, "norm_before_residual": False}


@pytest.fixture(scope="module")
def all_on(tmp_path_factory):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("e31"), "eagle3", ALL_ON)
    loaded = checkpoint.load_drafter(ckpt, device="cpu")
    with torch.no_grad():  # fc_norm weights away from 1, so a missing norm would show
        for norm in loaded.drafter.fc_norm:
            norm.weight.mul_(torch.linspace(0.5, 1.5, norm.weight.numel()))
    return ckpt, loaded


@pytest.fixture(scope="module")
def no_nbr(tmp_path_factory):
    ckpt = make_checkpoint(tmp_path_factory.mktemp("e31b"), "eagle3", NO_NBR)
    return ckpt, checkpoint.load_drafter(ckpt, device="cpu")


def test_vllm_export_carries_the_options_and_speculators_computes_the_same(all_on, tmp_path):
    spec = speculators()
    ckpt, loaded = all_on
    out = export(ckpt, "vllm", tmp_path / "vllm", loaded=loaded).out_dir
    config = json.loads((out / "config.json").read_text())
    assert (config["norm_before_residual"], config["fc_norm"], config["norm_output"]) == (True, True, True)
    tensors = load_file(str(out / "model.safetensors"))
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(tensors)
    model_config = spec.SpeculatorModelConfig.from_pretrained(str(out))
    model_config.transformer_layer_config._attn_implementation = "sdpa"
    model = spec.SpeculatorModel.from_pretrained(str(out), config=model_config).eval()
    d, target = loaded.drafter, loaded.target
    ids = torch.randint(3, target.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    out_t = target.forward(ids)
    aux = torch.cat([out_t.hidden_states[i] for i in d.aux_layer_ids], dim=-1)  # [1, s, 3h]
    with torch.no_grad():
        # the 3-step teacher-forced unroll: speculators' forward vs draftsmith's training unroll
        theirs = model(hidden_states=aux[:, :-1], input_ids=ids[:, 1:], document_ids=torch.zeros(1, 11, dtype=torch.long),
                       position_ids=torch.arange(1, 12)[None], ttt_steps=3)
        ours = [d.draft_ids()[logits[0].argmax(-1)] for _, logits in d.unroll(
            {"input_ids": ids, "attention_mask": torch.ones_like(ids), "aux_hidden_states": aux}, steps=3)]
        # step 0's logits numerically: fc_norm -> fc -> layer (normed residual) -> norm -> lm_head
        fused = torch.cat([n(c) for n, c in zip(model.fc_norm, aux[:, :-1].chunk(3, dim=-1))], dim=-1)
        x = torch.cat([model.embed_tokens(ids[:, 1:]), model.fc(fused)], dim=-1)
        pos = torch.arange(11)[None]
        y = model.layers[0](x, attention_mask=None, position_ids=pos, position_embeddings=model.rotary_emb(x, pos))
        y = y[0] if isinstance(y, tuple) else y
        their_logits = model.lm_head(model.norm(y))
        our_logits = next(d.unroll({"input_ids": ids, "attention_mask": torch.ones_like(ids), "aux_hidden_states": aux},
                                   steps=1))[1]
    assert torch.allclose(our_logits, their_logits, atol=1e-5, rtol=1e-4), (our_logits - their_logits).abs().max()
    for t in range(3):
        n = 11 - t
        assert torch.equal(ours[t], (theirs[t][0, :n] + model.d2t[theirs[t][0, :n]])), f"TTT step {t} differs"


@pytest.mark.parametrize("fmt", ["sglang", "trtllm"])
def test_engines_without_norm_before_residual_refuse_it(all_on, tmp_path, fmt):
    ckpt, loaded = all_on
    with pytest.raises(ValueError, match="norm_before_residual=true.*--to vllm"):
        export(ckpt, fmt, tmp_path / fmt, loaded=loaded)
    assert not (tmp_path / fmt).exists()


@pytest.mark.parametrize("fmt", ["sglang", "trtllm"])
def test_fc_norm_and_norm_output_reach_sglang_and_trtllm(no_nbr, tmp_path, fmt):
    ckpt, loaded = no_nbr
    out = export(ckpt, fmt, tmp_path / fmt, loaded=loaded).out_dir  # validated, round trip included
    config = json.loads((out / "config.json").read_text())
    assert config["fc_norm"] is True and config["norm_output"] is True
    assert {f"fc_norm.{i}.weight" for i in range(3)} <= set(load_file(str(out / "model.safetensors")))


def test_final_hidden_state_feature_trains_but_is_refused_at_export(tmp_path):
    """aux id L (the target's final hidden state) is a training option; no engine captures it."""
    ckpt = make_checkpoint(tmp_path / "last", "eagle3", {"ttt_steps": 2, "aux_layer_ids": [1, 2, 4]})
    loaded = checkpoint.load_drafter(ckpt, device="cpu")
    assert loaded.target.num_layers == 4
    with pytest.raises(ValueError, match="final post-norm hidden state"):
        export(ckpt, "vllm", tmp_path / "vllm", loaded=loaded)
