"""The EAGLE tensor layouts several engines share: EAGLE-1 (vLLM and SGLang, Eagle1Common below; each engine's
folder registers its own layout on it) and the EAGLE-3 helpers (tensor specs, norms, aux-layer ids) that SGLang,
vLLM (speculators) and TensorRT-LLM (Model Optimizer) each spell their own way.

Aux-layer id conventions (read from each engine's source, see docs/export.md):
  draftsmith, vLLM   id i = hidden_states[i], the INPUT of target layer i (vLLM captures
                     `hidden_states + residual` before running layer i)
  SGLang, TRT-LLM    id i = the OUTPUT of target layer i = hidden_states[i + 1] (SGLang's
                     set_eagle3_layers_to_capture adds 1; TRT-LLM / Model Optimizer hook
                     layer outputs; both default to [1, L//2 - 1, L - 4])

EAGLE-1 for vLLM and SGLang: both engines load one Llama decoder layer behind fc [h, 2h].

Read from vLLM 0.9.2 / 0.20.0 / 0.27.0 / 0.33.0 (model_executor/models/llama_eagle.py EagleLlamaForCausalLM,
transformers_utils/configs/eagle.py, v1/spec_decode/ sharing) and SGLang 0.5.23 (srt/models/llama_eagle.py
LlamaForCausalLMEagle, srt/speculative/eagle_worker_v2.py):
  config.json  a Llama config of the draft layer (llama_fields: num_hidden_layers 1, the target's hidden size,
               vocabulary, rope and max positions). architectures: vLLM ["EagleLlamaForCausalLM"] (its
               EAGLEConfig keeps a name starting with "Eagle"; "LlamaForCausalLM" would be renamed to it),
               SGLang ["LlamaForCausalLMEagle"] (the class its registry loads).
  tensors      fc.weight [h, 2h] reading [embedding(x) ; feature]; layers.0.self_attn.{q,k,v,o}_proj.weight,
               layers.0.mlp.{gate,up,down}_proj.weight, layers.0.post_attention_layernorm.weight. Layer 0
               has NO input_layernorm (both engines replace it by the identity, as draftsmith's layer has
               none) and there is no final norm (the output is hidden + residual in both). No embed_tokens
               and no lm_head: vLLM shares the target's when the checkpoint has none (llm_base_proposer.py
               has_own_embed_tokens / has_own_lm_head), SGLang always (set_embed_and_head), as draftsmith's
               EAGLE-1 uses the target's frozen ones.
  fc bias      vLLM builds fc with bias=False (its AutoWeightsLoader rejects an fc.bias tensor): a drafter with a
               trained bias (drafter.fc_bias=true, the default) is refused for vLLM. SGLang's fc is
               nn.Linear(2h, h) WITH a bias, which stays uninitialised unless the file has it: the SGLang
               export always writes fc.bias (zeros for a drafter trained with drafter.fc_bias=false).
  features     both engines feed the target's final hidden state AFTER its last norm (the lm_head input),
               what draftsmith's EAGLE-1 reads (last_hidden_state = hidden_states[-1]).
  MLP          both engines' LlamaMLP runs SiLU only: a target with another hidden_act is refused.

    vllm serve VERIFIER --speculative-config '{"model": OUT, "num_speculative_tokens": K, "method": "eagle"}'
    python -m sglang.launch_server --model-path VERIFIER --speculative-algorithm EAGLE \
        --speculative-draft-model-path OUT --speculative-num-steps K --speculative-eagle-topk 1 \
        --speculative-num-draft-tokens K+1
"""
from __future__ import annotations

from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.export.layout import (
    DTYPES,
    LLAMA_KEYS,
    TensorSpec,
    cast_floats,
    llama_fields,
    read_export,
)

DEFAULT_K = 5  # draft tokens per round when --num-speculative-tokens is not given (EAGLE-1 has no trained bound)
REQUIRED_KEYS = ["architectures", *LLAMA_KEYS, "attention_bias", "mlp_bias", "torch_dtype"]


def silu_refusals(target_config, engine: str) -> list[str]:
    """vLLM's and SGLang's LlamaMLP raise on any activation but SiLU; the draft layer copies the target's."""
    from draftsmith.targets.archs import text_config

    act = getattr(text_config(target_config), "hidden_act", "silu")
    if act == "silu":
        return []
    return [f"{engine}: its EAGLE-1 draft layer (LlamaMLP) runs SiLU only, and this target's hidden_act is {act!r}"]


def eagle1_config(loaded, dtype: torch.dtype, architectures: list[str]) -> dict:
    d, target = loaded.drafter, loaded.target
    return {"architectures": list(architectures), **llama_fields(d.layer_config, target.config, dtype)}


def eagle1_tensor_spec(config: dict, with_bias: bool) -> dict[str, TensorSpec]:
    """Shapes of every tensor the engine loads, from config.json alone."""
    dtype = DTYPES[config["torch_dtype"]]
    h, inter = config["hidden_size"], config["intermediate_size"]
    q, kv = config["num_attention_heads"] * config["head_dim"], config["num_key_value_heads"] * config["head_dim"]
    p = "layers.0."
    spec = {
        "fc.weight": TensorSpec((h, 2 * h), dtype),  # [embedding ; feature] -> h
        f"{p}self_attn.q_proj.weight": TensorSpec((q, h), dtype),
        f"{p}self_attn.k_proj.weight": TensorSpec((kv, h), dtype),
        f"{p}self_attn.v_proj.weight": TensorSpec((kv, h), dtype),
        f"{p}self_attn.o_proj.weight": TensorSpec((h, q), dtype),
        f"{p}mlp.gate_proj.weight": TensorSpec((inter, h), dtype),
        f"{p}mlp.up_proj.weight": TensorSpec((inter, h), dtype),
        f"{p}mlp.down_proj.weight": TensorSpec((h, inter), dtype),
        f"{p}post_attention_layernorm.weight": TensorSpec((h,), dtype),
    }
    if with_bias:
        spec["fc.bias"] = TensorSpec((h,), dtype)
    return spec


def eagle1_problems(config: dict, tensors: dict, loaded, architectures: list[str]) -> list[str]:
    """config.json against what the engines' loaders read and the trained drafter."""
    target, d = loaded.target, loaded.drafter
    want = {"architectures": list(architectures), "model_type": "llama", "num_hidden_layers": 1,
            "hidden_size": target.hidden_size, "vocab_size": target.vocab_size,
            "num_attention_heads": d.layer_config.num_attention_heads,
            "num_key_value_heads": d.layer_config.num_key_value_heads,
            "attention_bias": False, "mlp_bias": False, "hidden_act": "silu"}
    problems = [f"config.json: {key} is {config.get(key)!r}, expected {value!r} (the engine's EAGLE-1 layer reads it)"
                for key, value in want.items() if config.get(key) != value]
    bias = tensors.get("fc.bias")
    if bias is not None and not d.cfg.fc_bias and bool(bias.ne(0).any()):
        problems.append("model.safetensors: fc.bias is not zero, but the drafter was trained without one "
                        "(drafter.fc_bias=false)")
    return problems


def eagle1_from_weights(weights: dict[str, torch.Tensor], loaded, source: str):
    """A fresh EAGLE-1 drafter for loaded.target holding `weights`, strictly; fc.bias follows the drafter's
    option (zeros for a bias the file lacks, dropped when the drafter has none: the gate checked it is zero)."""
    from draftsmith.heads.eagle1 import Eagle1Drafter

    drafter = Eagle1Drafter.from_target(loaded.config.drafter.options, loaded.target)
    weights = dict(weights)
    if drafter.fc.bias is None:
        weights.pop("fc.bias", None)
    elif "fc.bias" not in weights:
        weights["fc.bias"] = torch.zeros_like(drafter.fc.bias)
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UserError(f"{source}: re-import failed: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return drafter.eval()


class Eagle1Common:
    """What the vLLM and SGLang EAGLE-1 layouts share: keys, checks and the round trip."""

    architectures: list[str] = []
    with_bias = False

    def required_config_keys(self) -> list[str]:
        return list(REQUIRED_KEYS)

    def expected_tensors(self, config: dict) -> dict[str, TensorSpec]:
        return eagle1_tensor_spec(config, self.with_bias)

    def llama_fields(self, config: dict) -> dict | None:
        return config  # the draft layer's Llama fields are the top level

    def check_format(self, export_dir: Path, config: dict, tensors: dict, loaded) -> list[str]:
        return eagle1_problems(config, tensors, loaded, self.architectures)

    def load_back(self, export_dir: Path, loaded):
        _, _, tensors = read_export(export_dir)
        return eagle1_from_weights(tensors, loaded, str(export_dir))

    def reference_drafter(self, loaded, dtype: torch.dtype):
        return eagle1_from_weights(cast_floats(loaded.drafter.state_dict_for_export(), dtype), loaded, "trained drafter")


def check_eagle3_aux_count(aux_ids: list[int], engine: str) -> None:
    """vLLM's Eagle3LlamaForCausalLM sizes fc as target_hidden_size * 3 whatever the config says (no
    config field sets the count), and SGLang's and TensorRT-LLM's EAGLE-3 drafts do the same: an
    export of another count would fail to load there (fc shape mismatch)."""
    if len(aux_ids) != EAGLE3_NUM_AUX:
        raise UserError(f"drafter.aux_layer_ids {list(aux_ids)}: {engine}'s EAGLE-3 draft reads exactly "
                         f"{EAGLE3_NUM_AUX} aux layers (it builds fc for 3 * target_hidden_size, no config field "
                         f"changes that); retrain with 3 ids, e.g. the default low/mid/high (drafter.aux_layer_ids=null)")


def output_id_refusals(target_config, engine: str) -> list[str]:
    """SGLang / TensorRT-LLM name aux layers by layer OUTPUT: a shallow target's default ids include 0."""
    from draftsmith.targets.archs import default_aux_layer_ids, text_config

    layers = text_config(target_config).num_hidden_layers
    if min(default_aux_layer_ids(layers)) >= 1:
        return []
    return [f"{engine}: aux layer ids name layer outputs, and a {layers}-layer target's default ids include 0 "
            "(the embedding output); use a target with >= 4 layers or aux_layer_ids >= 1"]


def output_of_layer_ids(aux_ids: list[int], engine: str) -> list[int]:
    """draftsmith ids (input of layer i) -> SGLang / TRT-LLM ids (output of layer i - 1)."""
    if any(i < 1 for i in aux_ids):
        raise UserError(
            f"aux layer ids {aux_ids} include 0 (the embedding output), which {engine} cannot capture: its ids "
            "name layer outputs. Retrain with drafter.aux_layer_ids >= 1 (e.g. the default [2, L//2, L-3])"
        )
    return [i - 1 for i in aux_ids]


def eagle3_tensor_spec(llama: dict, draft_vocab: int, num_aux: int, target_hidden: int, layer_prefix: str,
                       dtype: torch.dtype, with_t2d: bool, with_embed: bool, fc_norm: bool = False) -> dict[str, TensorSpec]:
    """Shapes every EAGLE-3 tensor must have, from the config's Llama fields alone (fc_norm: EAGLE 3.1's
    per-aux-layer norms fc_norm.{i}.weight, as vLLM, SGLang and TensorRT-LLM name them)."""
    h, V = llama["hidden_size"], llama["vocab_size"]
    q = llama["num_attention_heads"] * llama["head_dim"]
    kv = llama["num_key_value_heads"] * llama["head_dim"]
    inter = llama["intermediate_size"]
    p = layer_prefix
    spec = {
        "fc.weight": TensorSpec((h, num_aux * target_hidden), dtype),
        f"{p}hidden_norm.weight": TensorSpec((h,), dtype),
        f"{p}input_layernorm.weight": TensorSpec((h,), dtype),
        f"{p}post_attention_layernorm.weight": TensorSpec((h,), dtype),
        f"{p}self_attn.q_proj.weight": TensorSpec((q, 2 * h), dtype),  # attention reads [emb ; hidden]
        f"{p}self_attn.k_proj.weight": TensorSpec((kv, 2 * h), dtype),
        f"{p}self_attn.v_proj.weight": TensorSpec((kv, 2 * h), dtype),
        f"{p}self_attn.o_proj.weight": TensorSpec((h, q), dtype),
        f"{p}mlp.gate_proj.weight": TensorSpec((inter, h), dtype),
        f"{p}mlp.up_proj.weight": TensorSpec((inter, h), dtype),
        f"{p}mlp.down_proj.weight": TensorSpec((h, inter), dtype),
        "norm.weight": TensorSpec((h,), dtype),
        "lm_head.weight": TensorSpec((draft_vocab, h), dtype),
        "d2t": TensorSpec((draft_vocab,), torch.int64),
    }
    if fc_norm:
        spec.update({f"fc_norm.{i}.weight": TensorSpec((target_hidden,), dtype) for i in range(num_aux)})
    if with_t2d:
        spec["t2d"] = TensorSpec((V,), torch.bool)
    if with_embed:
        spec["embed_tokens.weight"] = TensorSpec((V, h), dtype)
    return spec


def eagle3_norm_fields(drafter, engine: str) -> dict:
    """EAGLE 3.1's config fields for an engine that reads fc_norm and norm_output (SGLang, TensorRT-LLM)
    but has no norm_before_residual: a drafter trained with it would run differently there, so refuse."""
    if drafter.cfg.norm_before_residual:
        raise UserError(
            f"this EAGLE-3 drafter was trained with drafter.norm_before_residual=true, which {engine} cannot run "
            "(its draft layer always adds the raw hidden state as the residual): export it with --to vllm, "
            "or retrain with drafter.norm_before_residual=false for this engine")
    return {"fc_norm": bool(drafter.cfg.fc_norm), "norm_output": bool(drafter.cfg.norm_output)}


def eagle3_norm_problems(config: dict, drafter) -> list[str]:
    """config.json's EAGLE 3.1 fields against the trained drafter's options."""
    problems = []
    for key in ("norm_before_residual", "fc_norm", "norm_output"):
        trained = drafter.eagle31_norms(drafter.cfg)[key]
        if key in config and config[key] is not trained:
            problems.append(f"config.json: {key} is {config[key]!r} but the drafter was trained with "
                            f"drafter.{key}={trained!r}")
    return problems


def eagle3_weights(loaded, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """The trained drafter's tensors in draftsmith (= SGLang) names, cast to the export dtype."""
    last = loaded.target.num_layers
    if last in loaded.drafter.aux_layer_ids:
        raise UserError(f"drafter.aux_layer_ids {loaded.drafter.aux_layer_ids} include {last}, the target's final "
                         "post-norm hidden state, which no serving engine captures for a draft; retrain with ids "
                         f"in 0..{last - 1} to export")
    return cast_floats(loaded.drafter.state_dict_for_export(), dtype)


def eagle3_from_weights(weights: dict[str, torch.Tensor], loaded, source: str):
    """A fresh EAGLE-3 drafter for loaded.target holding `weights` (draftsmith names), strictly."""
    from draftsmith.heads.eagle3 import Eagle3Drafter

    options = loaded.config.drafter.options
    # Kept in the target's dtype: bf16/fp16 weights are upcast exactly on load, and the proposer
    # then runs the rounded weights in full precision (both sides of the round trip alike).
    drafter = Eagle3Drafter.from_target(options, loaded.target, None)
    missing, unexpected = drafter.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise UserError(f"{source}: re-import failed: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
    return drafter.eval()


EAGLE3_NUM_AUX = 3  # vLLM, SGLang and TensorRT-LLM build fc as [3 * target_hidden -> h]


# draftsmith / SGLang names below `midlayer.`; vLLM and TRT-LLM spell them `layers.0.`.
EAGLE3_LAYER_TENSORS = (
    "hidden_norm.weight", "input_layernorm.weight", "post_attention_layernorm.weight",
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
)
