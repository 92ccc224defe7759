"""Which drafter kinds vLLM serves for the hybrid and vision-language targets, by release (engine_versions.TARGETS).

Read from the wheels vllm-0.9.2, vllm-0.20.0, vllm-0.27.0 and vllm-0.33.0 (paths inside the package):
  - EAGLE-3, P-EAGLE (method eagle3), DFlash and DSpark read the target's aux hidden states, which vLLM takes only
    from a model class implementing SupportsEagle3 (model_executor/models/interfaces.py): the V1 runner raises
    "Model does not support EAGLE3 interface" otherwise (v1/worker/gpu_model_runner.py,
    _setup_eagle3_aux_hidden_state_outputs; v1/worker/gpu/spec_decode/eagle/eagle3_utils.py, whose
    requires_aux_hidden_states lists eagle3, dflash and dspark).
  - EAGLE-1 (method eagle), Medusa and the MLP speculator read only the last hidden state: any model class serves
    them (whether the release serves the kind at all is engine_versions.SERVING's row).
  - A target whose architecture is not in model_executor/models/registry.py is served by nothing.
Each class below was checked for SupportsEagle3 in its own file and its bases (Qwen3.5's VLM classes and
Qwen3VLMoeForConditionalGeneration (qwen3_vl_moe.py) inherit it from Qwen3VLForConditionalGeneration; its MoE language
model adds the aux hidden states in its forward, _maybe_add_hidden_state). Llama-4 (llama4): mllama4.py's
Llama4ForConditionalGeneration lists SupportsEagle3 from 0.20 (set_aux_hidden_state_layers delegates to its
Llama4ForCausalLM), not in 0.9.2. The keys are HF model_types: a real Qwen3.5 checkpoint is `qwen3_5`
(Qwen3_5ForConditionalGeneration), the text-only config `qwen3_5_text` (Qwen3_5ForCausalLM).
"""
from __future__ import annotations

from draftsmith.export.engine_versions import RELEASES, TARGETS, Need, TargetClass, TargetTable, aux_state_need

AUX = frozenset({"SupportsEagle3"})  # the interface whose set_aux_hidden_state_layers captures the aux hidden states
_AUX = Need("SupportsEagle3 (set_aux_hidden_state_layers), the one source of the aux hidden states it reads "
            "(v1/worker/gpu_model_runner.py: \"Model does not support EAGLE3 interface\")", all_of=AUX)
M = "model_executor/models/"


def _aux(cls: str, file: str) -> TargetClass:
    return TargetClass(cls, M + file, AUX)


def _last(cls: str, file: str) -> TargetClass:
    return TargetClass(cls, M + file, frozenset())  # the last hidden state only: EAGLE-1, Medusa, MLP


TABLE = TargetTable("vllm", "vLLM", M + "registry.py", RELEASES["vllm"], needs=aux_state_need(_AUX))
TARGETS["vllm"] = TABLE

_QWEN3_NEXT = _aux("Qwen3NextForCausalLM", "qwen3_next.py")
TABLE.register(("qwen3_next",), {"0.9.2": None, "0.20.0": _last("Qwen3NextForCausalLM", "qwen3_next.py"),
                                 "0.27.0": _QWEN3_NEXT, "0.33.0": _QWEN3_NEXT})
_QWEN35_VLM = _aux("Qwen3_5ForConditionalGeneration", "qwen3_5.py")
TABLE.register(("qwen3_5",), dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"), _QWEN35_VLM) | {"0.9.2": None})
_QWEN35_MOE_VLM = _aux("Qwen3_5MoeForConditionalGeneration", "qwen3_5.py")
TABLE.register(("qwen3_5_moe",), dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"), _QWEN35_MOE_VLM) | {"0.9.2": None})
TABLE.register(("qwen3_5_text",), {"0.9.2": None, "0.20.0": None,
                                   **dict.fromkeys(("0.27.0", "0.33.0"), _aux("Qwen3_5ForCausalLM", "qwen3_5.py"))})
TABLE.register(("qwen3_5_moe_text",), {"0.9.2": None, "0.20.0": None, **dict.fromkeys(
    ("0.27.0", "0.33.0"), _aux("Qwen3_5MoeForCausalLM", "qwen3_5.py"))})
TABLE.register(("lfm2",), {"0.9.2": None, **dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"),
                                                           _last("Lfm2ForCausalLM", "lfm2.py"))})
TABLE.register(("falcon_h1",), dict.fromkeys(RELEASES["vllm"], _last("FalconH1ForCausalLM", "falcon_h1.py")))
_NEMOTRON_H = "NemotronHForCausalLM"
TABLE.register(("nemotron_h",), {**dict.fromkeys(("0.9.2", "0.20.0"), _last(_NEMOTRON_H, "nemotron_h.py")),
                                 **dict.fromkeys(("0.27.0", "0.33.0"), _aux(_NEMOTRON_H, "nemotron_h.py"))})
TABLE.register(("granitemoehybrid",), dict.fromkeys(RELEASES["vllm"], _last("GraniteMoeHybridForCausalLM",
                                                                            "granitemoehybrid.py")))
# 0.27 and 0.33 register KimiLinearForCausalLM from vllm/models/kimi_k3/ (outside model_executor/); in 0.33 only the
# CUDA class (nvidia/model.py) implements SupportsEagle3, the ROCm / XPU one (amd/linear.py) does not.
TABLE.register(("kimi_linear",), {
    "0.9.2": None, "0.20.0": _last("KimiLinearForCausalLM", "kimi_linear.py"),
    "0.27.0": TargetClass("KimiLinearForCausalLM", "models/kimi_k3/nvidia/model.py", frozenset()),
    "0.33.0": TargetClass("KimiLinearForCausalLM", "models/kimi_k3/nvidia/model.py (CUDA only)", AUX)})
TABLE.register(("gemma3",), dict.fromkeys(RELEASES["vllm"], _last("Gemma3ForConditionalGeneration", "gemma3_mm.py")))
TABLE.register(("qwen2_5_vl",), {"0.9.2": _last("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl.py"),
                                 **dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"),
                                                 _aux("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl.py"))})
TABLE.register(("qwen3_vl",), {"0.9.2": None, **dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"),
                                                              _aux("Qwen3VLForConditionalGeneration", "qwen3_vl.py"))})
TABLE.register(("qwen3_vl_moe",), {"0.9.2": None, **dict.fromkeys(
    ("0.20.0", "0.27.0", "0.33.0"), _aux("Qwen3VLMoeForConditionalGeneration (Qwen3VLForConditionalGeneration)",
                                         "qwen3_vl_moe.py"))})
TABLE.register(("llama4",), {"0.9.2": _last("Llama4ForConditionalGeneration", "mllama4.py"),
                             **dict.fromkeys(("0.20.0", "0.27.0", "0.33.0"),
                                             _aux("Llama4ForConditionalGeneration", "mllama4.py"))})
