"""Issue 19: the conventions that match in every engine, one test each, checked against a tiny target built
here (forward hooks say what each layer's input and output and the final norm are) and the export files.

  aux ids     vLLM (model_executor/models/llama.py, 0.33: aux state idx = hidden + residual before layer idx)
              names the INPUT of target layer i, as draftsmith does; SGLang (srt/models/llama.py
              set_eagle3_layers_to_capture: layers_to_capture = [i + 1 for i in ids]) and TensorRT-LLM name
              the OUTPUT of layer i, so their exports write draftsmith id - 1.
  features    EAGLE-3 and DFlash read the pre-norm residual stream; Medusa and EAGLE-1 the post-norm final
              state (the lm_head input), which vLLM and SGLang pass for them.
  d2t         offsets: target id = draft id + d2t[draft id], in every format that carries d2t.
  sharing     which embedding and lm_head each file carries (and so which the engine uses).
  rope        rope_theta, rope_scaling, rope_parameters and max positions copied into every export; a partial
              rotary factor is never written (the draft layer rotates its whole head, in training and serving).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from conftest import LLAMA3_ROPE
from safetensors.torch import load_file

from draftsmith import checkpoint
from draftsmith.data import features
from draftsmith.testing import tiny_target

KIND_OPTIONS = {
    "eagle3": {"ttt_steps": 2, "draft_vocab_size": 100},
    "dflash": {"block_size": 3, "num_layers": 1, "draft_vocab_size": 100},
    "dspark": {"block_size": 3, "num_layers": 1, "markov_rank": 8, "draft_vocab_size": 100},
    "peagle": {"num_depths": 2, "draft_vocab_size": 100},
    "medusa": {"num_heads": 2, "num_layers": 1},
    "eagle1": {"fc_bias": False},
}
# (kind, format) exported below; vLLM 0.27 is the newest release serving Medusa (export/engine_versions.py)
EXPORTS = [("eagle3", "vllm"), ("eagle3", "sglang"), ("eagle3", "trtllm"), ("dflash", "vllm"), ("dspark", "vllm"),
           ("peagle", "vllm"), ("medusa", "vllm"), ("eagle1", "vllm"), ("eagle1", "sglang")]


CHECKPOINTS = {kind: (kind, options, {"rope": LLAMA3_ROPE, "max_positions": 4096})
               for kind, options in KIND_OPTIONS.items()}


@pytest.fixture(scope="module")
def exported(ckpts, tmp_path_factory):
    from draftsmith.export import export
    from draftsmith.export.layout import ExportOptions

    root = tmp_path_factory.mktemp("exports")
    out = {}
    for kind, fmt in EXPORTS:
        path, loaded = ckpts[kind]
        opts = ExportOptions(engine_version="0.27" if kind == "medusa" else None)
        out[(kind, fmt)] = export(path, fmt, root / f"{kind}-{fmt}", opts, loaded=loaded).out_dir
    return out


def read(export_dir: Path) -> tuple[dict, dict]:
    return json.loads((export_dir / "config.json").read_text()), load_file(str(export_dir / "model.safetensors"))


def captured_states(target, ids: torch.Tensor) -> dict:
    """Forward hooks on the tiny target: each decoder layer's input and output (the residual stream), each
    layer's input-norm output, and the final norm's input and output."""
    seen: dict = {"input": {}, "output": {}, "normed_input": {}}
    hooks = []
    model = target.model.model
    for i, layer in enumerate(model.layers):
        hooks.append(layer.register_forward_pre_hook(
            lambda mod, args, kwargs, i=i: seen["input"].__setitem__(i, (args[0] if args else kwargs["hidden_states"]).clone()),
            with_kwargs=True))
        hooks.append(layer.register_forward_hook(
            lambda mod, args, out, i=i: seen["output"].__setitem__(i, (out[0] if isinstance(out, tuple) else out).clone())))
        hooks.append(layer.input_layernorm.register_forward_hook(
            lambda mod, args, out, i=i: seen["normed_input"].__setitem__(i, out.clone())))
    hooks.append(model.norm.register_forward_hook(
        lambda mod, args, out: seen.update(final_pre_norm=args[0].clone(), final_post_norm=out.clone())))
    try:
        target.forward(ids)
    finally:
        for h in hooks:
            h.remove()
    return seen


def engine_aux_ids(fmt: str, config: dict) -> list[int]:
    if fmt == "vllm":
        return config.get("eagle_aux_hidden_state_layer_ids") or config["aux_hidden_state_layer_ids"]
    return config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]


def engine_capture(fmt: str, seen: dict, layer_id: int) -> torch.Tensor:
    """The state an engine captures for one id of its config: vLLM the input of that layer, SGLang and
    TensorRT-LLM its output."""
    return seen["input"][layer_id] if fmt == "vllm" else seen["output"][layer_id]


@pytest.mark.parametrize("kind,fmt", [("eagle3", "vllm"), ("eagle3", "sglang"), ("eagle3", "trtllm"),
                                      ("dflash", "vllm"), ("dspark", "vllm"), ("peagle", "vllm")])
def test_the_engine_captures_the_pre_norm_states_draftsmith_trained_on(ckpts, exported, kind, fmt):
    """aux id i = input of target layer i (vLLM) = output of layer i - 1 (SGLang, TRT-LLM: id - 1 written),
    and the features are the raw residual stream, not the layer's normed input."""
    loaded = ckpts[kind][1]
    target, drafter = loaded.target, loaded.drafter
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(1))
    trained = features.compute(target, ids, torch.ones_like(ids), set(drafter.required_features),
                               drafter.feature_layers())["aux_hidden_states"]  # [1, s, n*h]
    seen = captured_states(target, ids)
    config, _ = read(exported[(kind, fmt)])
    served = torch.cat([engine_capture(fmt, seen, j) for j in engine_aux_ids(fmt, config)], dim=-1)
    torch.testing.assert_close(served, trained, atol=0, rtol=0)
    normed = torch.cat([seen["normed_input"][i] for i in drafter.feature_layers()], dim=-1)
    assert not torch.allclose(normed, trained, atol=1e-3)  # pre-norm, not the layer's normed input


@pytest.mark.parametrize("kind", ["medusa", "eagle1"])
def test_medusa_and_eagle1_read_the_post_norm_final_state(ckpts, kind):
    loaded = ckpts[kind][1]
    target, drafter = loaded.target, loaded.drafter
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(2))
    feats = features.compute(target, ids, torch.ones_like(ids), set(drafter.required_features), [])
    seen = captured_states(target, ids)
    torch.testing.assert_close(feats["last_hidden_state"], seen["final_post_norm"], atol=0, rtol=0)
    assert not torch.allclose(feats["last_hidden_state"], seen["final_pre_norm"], atol=1e-3)


@pytest.mark.parametrize("kind,fmt", [("eagle3", "vllm"), ("eagle3", "sglang"), ("eagle3", "trtllm"),
                                      ("dflash", "vllm"), ("dspark", "vllm"), ("peagle", "vllm")])
def test_d2t_is_written_as_offsets(ckpts, exported, kind, fmt):
    """target id = draft id + d2t[draft id] (SGLang's and vLLM's reading), never the absolute target ids."""
    drafter = ckpts[kind][1].drafter
    _, tensors = read(exported[(kind, fmt)])
    d2t = tensors["d2t"]
    assert d2t.dtype == torch.int64 and d2t.shape == (100,)
    draft_to_target = torch.nonzero(drafter.t2d.cpu()).flatten()  # the 100 target ids of the draft vocabulary
    assert torch.equal(torch.arange(100) + d2t, draft_to_target)
    assert not torch.equal(d2t, draft_to_target)  # absolute ids would be a different file


def test_embedding_and_lm_head_sharing(ckpts, exported):
    """Which embedding and lm_head each file carries: the engines use the file's when present, else the target's."""
    def same(a, b):
        return torch.equal(a.float(), b.detach().float().cpu())

    for (kind, fmt), out in exported.items():
        loaded = ckpts[kind][1]
        config, tensors = read(out)
        target_embed = loaded.target.embed_tokens.weight
        if kind in ("eagle3", "dflash", "dspark", "peagle"):  # a draft-vocabulary lm_head of its own, trained
            assert same(tensors["lm_head.weight"], loaded.drafter.lm_head.weight), (kind, fmt)
            assert tensors["lm_head.weight"].shape[0] == 100
        if (kind, fmt) in (("eagle3", "vllm"), ("dflash", "vllm"), ("dspark", "vllm")):
            assert same(tensors["embed_tokens.weight"], target_embed), (kind, fmt)  # the target's, as speculators saves it
        elif kind == "peagle":
            assert same(tensors["embed_tokens.weight"], loaded.drafter.embed_tokens.weight)  # its own trained copy
            assert not same(tensors["embed_tokens.weight"], target_embed)
        else:  # SGLang / TRT-LLM EAGLE-3, Medusa, EAGLE-1: no embedding: the engine shares the target's
            assert "embed_tokens.weight" not in tensors, (kind, fmt)
        if kind == "eagle1":  # neither embedding nor lm_head: both engines share the target's, as draftsmith does
            assert "lm_head.weight" not in tensors
            assert loaded.drafter.lm_head[0] is loaded.target.lm_head
        if "tie_word_embeddings" in config:
            assert config["tie_word_embeddings"] is False, (kind, fmt)  # SGLang would make lm_head the embedding


def llama_fields_of(kind: str, fmt: str, config: dict) -> dict | None:
    from draftsmith.export import EXPORTERS

    return EXPORTERS.get(fmt)().llama_fields(config, kind)


def test_rope_fields_are_copied_into_every_export(ckpts, exported):
    for (kind, fmt), out in exported.items():
        config, _ = read(out)
        llama = llama_fields_of(kind, fmt, config)
        if llama is None:  # Medusa has no attention layer and no rope
            assert kind == "medusa"
            continue
        assert llama["max_position_embeddings"] == 4096, (kind, fmt)
        assert llama["rope_theta"] == 500000.0, (kind, fmt)
        scaling = llama.get("rope_scaling") or {}
        assert scaling.get("rope_type") == "llama3" and scaling.get("factor") == 8.0, (kind, fmt)
        assert scaling.get("original_max_position_embeddings") == 512, (kind, fmt)
        if "rope_parameters" in llama:
            assert llama["rope_parameters"] == LLAMA3_ROPE, (kind, fmt)


def nested_keys(node) -> set[str]:
    if isinstance(node, dict):
        return set(node) | {k for v in node.values() for k in nested_keys(v)}
    if isinstance(node, list):
        return {k for v in node for k in nested_keys(v)}
    return set()


def test_partial_rotary_factor_is_never_written(tmp_path):
    """A GLM-4-style target rotates half of each head; the draft layer rotates its whole head in training, and an
    engine reading partial_rotary_factor from the draft config would rotate half: the export must not carry it."""
    from draftsmith import config as config_mod
    from draftsmith.export import EXPORTERS, export, formats_for
    from draftsmith.heads import DRAFTERS
    from draftsmith.targets import load as target_mod
    from draftsmith.testing import byte_tokenizer

    base = tiny_target()
    base.model.config.partial_rotary_factor = 0.5  # read by transformers' rope init: rotary dim = head_dim / 2
    base.model.save_pretrained(str(tmp_path / "target"))
    byte_tokenizer().save_pretrained(str(tmp_path / "target"))
    saved = json.loads((tmp_path / "target" / "config.json").read_text())
    assert 0.5 in (saved.get("partial_rotary_factor"), (saved.get("rope_parameters") or {}).get("partial_rotary_factor"))
    for kind in ("eagle3", "eagle1"):
        recipe = config_mod.from_dict({"target": {"path": str(tmp_path / "target"), "device": "cpu"},
                                       "drafter": {"kind": kind, **KIND_OPTIONS[kind]}})
        target = target_mod.from_config(recipe.target)
        drafter = DRAFTERS.get(kind).from_target(recipe.drafter.options, target, None)
        ckpt = checkpoint.save(tmp_path / f"{kind}-ckpt", drafter, target, recipe, step=1)
        for fmt in [f for f in formats_for(kind) if EXPORTERS.get(f).checked_in_process]:  # llama.cpp: no config.json
            out = export(ckpt, fmt, tmp_path / f"{kind}-{fmt}").out_dir
            assert "partial_rotary_factor" not in nested_keys(json.loads((out / "config.json").read_text())), (kind, fmt)
