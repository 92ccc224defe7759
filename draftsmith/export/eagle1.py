"""EAGLE-1 for vLLM and SGLang: both engines load one Llama decoder layer behind fc [h, 2h].

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

import shlex
from pathlib import Path

import torch

from draftsmith import config as config_mod
from draftsmith.core.errors import UserError
from draftsmith.export.common import (
    DTYPES,
    ExportFiles,
    ExportOptions,
    Layout,
    TensorSpec,
    cast_floats,
    layouts,
    llama_fields,
    num_tokens,
    read_export,
    serving_dtype,
    sidecar,
    verifier_name,
)
from draftsmith.export.sglang import LLAMA_KEYS
from draftsmith.export.vllm import VLLMLayout

DEFAULT_K = 5  # draft tokens per round when --num-speculative-tokens is not given (EAGLE-1 has no trained bound)
VLLM_ARCH, SGLANG_ARCH = ["EagleLlamaForCausalLM"], ["LlamaForCausalLMEagle"]
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

    drafter = Eagle1Drafter.from_target(config_mod.drafter_options(loaded.config), loaded.target)
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


@layouts("vllm").register("eagle1")
class VLLMEagle1Layout(Eagle1Common, VLLMLayout):
    """vLLM's EagleLlamaForCausalLM (see the module docstring)."""

    method = "eagle"
    architectures = VLLM_ARCH
    with_bias = False

    def refusals(self, target_config) -> list[str]:
        return silu_refusals(target_config, "vllm")

    def default_k(self, drafter) -> int:
        return DEFAULT_K

    def files(self, loaded, dtype, k, opts):
        problems = silu_refusals(loaded.target.config, "vLLM")
        if problems:
            raise UserError(f"export --to vllm: {problems[0]}; export a drafter of a SiLU target")
        tensors = cast_floats(loaded.drafter.state_dict_for_export(), dtype)
        bias = tensors.pop("fc.bias", None)
        if bias is not None and bool(bias.ne(0).any()):
            raise UserError("export --to vllm: this EAGLE-1 drafter's fc has a trained bias, and vLLM's EAGLE-1 "
                             "(model_executor/models/llama_eagle.py) builds fc without one, so it cannot load it; "
                             "retrain with drafter.fc_bias=false, or export --to sglang")
        return eagle1_config(loaded, dtype, VLLM_ARCH), tensors


@layouts("sglang").register("eagle1")
class SGLangEagle1Layout(Eagle1Common, Layout):
    """SGLang's LlamaForCausalLMEagle (see the module docstring)."""

    architectures = SGLANG_ARCH
    with_bias = True

    def refusals(self, target_config) -> list[str]:
        return silu_refusals(target_config, "sglang")

    def build(self, loaded, opts: ExportOptions, out_dir: Path) -> ExportFiles:
        problems = silu_refusals(loaded.target.config, "SGLang")
        if problems:
            raise UserError(f"export --to sglang: {problems[0]}; export a drafter of a SiLU target")
        dtype = serving_dtype(loaded, opts)
        tensors = cast_floats(loaded.drafter.state_dict_for_export(), dtype)
        if "fc.bias" not in tensors:  # SGLang's fc has a bias: zeros compute what the bias-free fc computes
            tensors["fc.bias"] = torch.zeros(tensors["fc.weight"].shape[0], dtype=dtype)
        k = num_tokens(loaded, opts, DEFAULT_K)
        side = sidecar(loaded, self.name, self.engine, opts, {"num_speculative_tokens": k})
        return ExportFiles(config=eagle1_config(loaded, dtype, SGLANG_ARCH), tensors=tensors, sidecar=side)

    def serve_command(self, out_dir: Path, loaded, opts: ExportOptions) -> str:
        k = num_tokens(loaded, opts, DEFAULT_K)
        return (f"python -m sglang.launch_server --model-path {shlex.quote(verifier_name(loaded, opts))} "
                f"--speculative-algorithm EAGLE --speculative-draft-model-path {shlex.quote(str(out_dir))} "
                f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
