"""The speculators format (speculators 0.9.0's *SpeculatorConfig), read by vLLM (transformers_utils/configs/speculators)
and, for the block drafters' backbone, by SGLang: the speculators_config block, the round trip into a draftsmith
drafter, and the block drafters' (DFlash, DSpark) Qwen3 layer keys, tensor shapes and head checks. vllm/ writes the
format; sglang/block.py derives its own shapes from it.
"""
from __future__ import annotations

import dataclasses

import torch

from draftsmith.core.errors import UserError
from draftsmith.export.layout import DTYPES, ExportOptions, TensorSpec, verifier_name

SPECULATORS_VERSION = "0.9.0"  # the speculators release whose loader this format is tested against


def speculators_config(loaded, opts: ExportOptions, algorithm: str, k: int) -> dict:
    """speculators_config {algorithm, default_proposal_method, proposal_methods, verifier}."""
    return {
        "algorithm": algorithm,
        "default_proposal_method": "greedy",
        "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": k,
                              "verifier_accept_k": 1, "accept_tolerance": 0.0}],
        "verifier": {"name_or_path": verifier_name(loaded, opts),
                     "architectures": list(getattr(loaded.target.config, "architectures", None) or [])},
    }


def proposal_problems(config: dict) -> list[str]:
    spec = config["speculators_config"]
    methods = [m.get("proposal_type") for m in spec["proposal_methods"]]
    if spec["default_proposal_method"] not in methods or not spec["proposal_methods"][0].get("speculative_tokens"):
        return [f"config.json: speculators_config.proposal_methods {spec['proposal_methods']} must hold "
                f"the default method {spec['default_proposal_method']!r} with speculative_tokens >= 1"]
    return []


def embedding_problems(tensors: dict, embed: torch.nn.Embedding, whose: str) -> list[str]:
    want = embed.weight.detach().cpu().to(tensors["embed_tokens.weight"].dtype)
    if not torch.equal(tensors["embed_tokens.weight"], want):
        return [f"model.safetensors: embed_tokens.weight differs from {whose} embedding"]
    return []


def load_plain(tensors: dict[str, torch.Tensor], loaded, source: str, without_lora: bool = False):
    """A fresh drafter of the checkpoint's kind holding `tensors` (its own state_dict names), strictly.
    without_lora: Medusa-2 heads rebuilt without their adapter (it is exported and checked separately)."""
    from draftsmith.heads import DRAFTERS

    options = loaded.config.drafter.options
    if without_lora:
        options = dataclasses.replace(options, lora=False)
    drafter = DRAFTERS.get(loaded.drafter.kind).from_target(options, loaded.target, None)  # upcasts on load
    missing, unexpected = drafter.load_state_dict(tensors, strict=False)
    if missing or unexpected:
        raise UserError(f"{source}: re-import failed: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return drafter.eval()


QWEN3_LAYER_KEYS = ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "num_key_value_heads", "head_dim", "rms_norm_eps", "vocab_size", "max_position_embeddings",
                    "rope_theta", "hidden_act")


def drafter_weights(tensors: dict[str, torch.Tensor], loaded, keep_embedding: bool = False) -> dict[str, torch.Tensor]:
    """Export tensors -> the drafter's own state_dict names (full-vocabulary exports carry no d2t/t2d;
    the embedding is the target's, except P-EAGLE's own)."""
    weights = {k: v for k, v in tensors.items() if keep_embedding or k != "embed_tokens.weight"}
    if "d2t" not in weights:
        V = loaded.target.vocab_size
        weights["d2t"] = torch.zeros(V, dtype=torch.long)
        weights["t2d"] = torch.ones(V, dtype=torch.bool)
    return weights


def dspark_head_problems(config: dict, tensors: dict, drafter) -> list[str]:
    """What vLLM's qwen3_dspark.py reads of the two heads: a config that drops the confidence head or sizes either
    head otherwise than trained, or head tensors that are not the trained ones."""
    want = {"enable_confidence_head": True, "confidence_head_with_markov": True, "markov_head_type": "vanilla",
            "markov_rank": drafter.cfg.markov_rank}
    problems = [f"config.json: {key} is {config.get(key)!r}, must be {value!r} (vLLM's qwen3_dspark.py builds the "
                "heads from it; without enable_confidence_head it drops the trained confidence head silently)"
                for key, value in want.items() if config.get(key) != value]
    trained = drafter.state_dict()
    for name in ("confidence_head.proj.weight", "confidence_head.proj.bias", "markov_head.markov_w2.weight"):
        if name in tensors and not torch.equal(tensors[name], trained[name].detach().cpu().to(tensors[name].dtype)):
            problems.append(f"model.safetensors: {name} differs from the trained drafter's")
    return problems


def block_tensor_spec(config: dict) -> dict[str, TensorSpec]:
    """A DFlash / DSpark backbone's tensors in the speculators format, from config.json alone (a Qwen3 layer config
    under transformer_layer_config)."""
    dtype = DTYPES[config["torch_dtype"]]
    lc = config["transformer_layer_config"]
    h, inter, d = lc["hidden_size"], lc["intermediate_size"], lc["head_dim"]
    H, KV, V, dv = lc["num_attention_heads"], lc["num_key_value_heads"], lc["vocab_size"], config["draft_vocab_size"]
    n_aux = len(config["aux_hidden_state_layer_ids"])
    spec = {"fc.weight": TensorSpec((h, n_aux * config["target_hidden_size"]), dtype),
            "hidden_norm.weight": TensorSpec((h,), dtype), "norm.weight": TensorSpec((h,), dtype),
            "lm_head.weight": TensorSpec((dv, h), dtype), "embed_tokens.weight": TensorSpec((V, h), dtype)}
    for i in range(lc["num_hidden_layers"]):
        p = f"layers.{i}."
        spec.update({
            p + "input_layernorm.weight": TensorSpec((h,), dtype),
            p + "post_attention_layernorm.weight": TensorSpec((h,), dtype),
            p + "self_attn.q_proj.weight": TensorSpec((H * d, h), dtype),
            p + "self_attn.k_proj.weight": TensorSpec((KV * d, h), dtype),
            p + "self_attn.v_proj.weight": TensorSpec((KV * d, h), dtype),
            p + "self_attn.o_proj.weight": TensorSpec((h, H * d), dtype),
            p + "self_attn.q_norm.weight": TensorSpec((d,), dtype),
            p + "self_attn.k_norm.weight": TensorSpec((d,), dtype),
            p + "mlp.gate_proj.weight": TensorSpec((inter, h), dtype),
            p + "mlp.up_proj.weight": TensorSpec((inter, h), dtype),
            p + "mlp.down_proj.weight": TensorSpec((h, inter), dtype),
        })
    if dv != V:
        spec["d2t"] = TensorSpec((dv,), torch.int64)
        spec["t2d"] = TensorSpec((V,), torch.bool)
    return spec
