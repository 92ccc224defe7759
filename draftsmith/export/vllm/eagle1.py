"""EAGLE-1 for vLLM: the layout export/eagle_tensors.py describes (Eagle1Common), with vLLM's own architecture
name and serve command."""
from __future__ import annotations

from draftsmith.core.errors import UserError
from draftsmith.export.eagle_tensors import DEFAULT_K, Eagle1Common, eagle1_config, silu_refusals
from draftsmith.export.layout import cast_floats, layouts
from draftsmith.export.vllm.layouts import VLLMLayout

VLLM_ARCH = ["EagleLlamaForCausalLM"]


@layouts("vllm").register("eagle1")
class VLLMEagle1Layout(Eagle1Common, VLLMLayout):
    """vLLM's EagleLlamaForCausalLM (see the module docstring)."""

    method = "eagle"
    architectures = VLLM_ARCH
    with_bias = False

    def refusals(self, target_config) -> list[str]:
        return silu_refusals(target_config, "vllm")

    def default_k(self, cfg) -> int:
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
