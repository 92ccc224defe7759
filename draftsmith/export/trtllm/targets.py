"""Which targets TensorRT-LLM's PyTorch backend captures EAGLE-3 aux hidden states for (engine_versions.TARGETS).

No released TensorRT-LLM loader could be read (trtllm/layouts.py: PyPI ships 1.2.x as an sdist that fetches its
wheel from NVIDIA's index), so these facts come from the repository's main branch as stored in December 2026
(NVIDIA/TensorRT-LLM, tensorrt_llm/_torch/models/, files as named below). The target's decoder layers must call
spec_metadata.maybe_capture_hidden_states(layer_idx, ...) for EAGLE-3 to get its aux hidden states:
  - captured: Qwen3-Next (Qwen3NextForCausalLM), Qwen3.5 and Qwen3.5-MoE (modeling_qwen3_5.py: thin wrappers over
    Qwen3NextForCausalLM, text and VLM), Nemotron-H (NemotronHLayer.forward).
  - not captured: Gemma-3 (modeling_gemma3vl.py registers Gemma3ForConditionalGeneration as Gemma3Model, whose
    text model is modeling_gemma3.py's Gemma3ForCausalLM, a plain DecoderModelForCausalLM whose Gemma3DecoderLayer
    takes no spec_metadata), Falcon-H1 (modeling_falcon_h1.py: its model passes no spec_metadata to its layers),
    Qwen2.5-VL and Qwen3-VL (Qwen2VLModelBase.forward in modeling_qwen2vl.py at c666e7e, Qwen3VLModelBase.forward
    in modeling_qwen3vl.py at f4faed1: self.llm.forward(...) is called without spec_metadata).
  - Qwen3-VL-MoE: Qwen3MoeVLModel (modeling_qwen3vl_moe.py at 14b0c8f, registered as
    Qwen3VLMoeForConditionalGeneration) is a Qwen3VLModelBase, whose forward calls self.llm.forward without
    spec_metadata (as for Qwen3-VL): not captured.
  - Llama-4 (llama4): Llama4ForConditionalGeneration (modeling_llama.py at 3a5901c) passes spec_metadata to its
    Llama4Model, whose Llama4DecoderLayer calls maybe_capture_hidden_states: captured.
  - no model class registered (register_auto_model): LFM2, Granite-4 hybrid (granitemoehybrid).
  - Kimi-Linear: KimiLinearForCausalLM (modeling_kimi_linear.py at cf328e8) is the Kimi K3 runtime. Its MoE raises
    without routed_expert_hidden_size ("Kimi K3 runtime expects the latent MoE") and its layers assert
    attn_res_block_size; transformers' kimi_linear config has neither, so it cannot load such a target.
"""
from __future__ import annotations

from draftsmith.export.engine_versions import TARGETS, Need, TargetClass, TargetTable, aux_state_need

M = "tensorrt_llm/_torch/models/"
SNAPSHOT = "main (2026-12 snapshot)"
EAGLE3 = frozenset({"maybe_capture_hidden_states"})  # its decoder layers capture the aux hidden states
NONE = frozenset()
TABLE = TargetTable("trtllm", "TensorRT-LLM", f"{M}: no register_auto_model for it", (SNAPSHOT,), needs=aux_state_need(
    Need("a decoder layer that calls spec_metadata.maybe_capture_hidden_states, the one source of EAGLE-3's aux hidden "
         "states (tensorrt_llm/_torch/speculative/eagle3.py)", all_of=EAGLE3)))
TARGETS["trtllm"] = TABLE


def _row(cls: str, file: str, kinds, why: str = "") -> dict:
    return {SNAPSHOT: TargetClass(cls, M + file, kinds, why)}


TABLE.register(("qwen3_next",), _row("Qwen3NextForCausalLM", "modeling_qwen3_next.py", EAGLE3))
TABLE.register(("qwen3_5", "qwen3_5_text"), _row("Qwen3_5ForCausalLM (Qwen3NextForCausalLM)", "modeling_qwen3_5.py",
                                                 EAGLE3))
TABLE.register(("qwen3_5_moe", "qwen3_5_moe_text"), _row("Qwen3_5MoeForCausalLM (Qwen3NextForCausalLM)",
                                                         "modeling_qwen3_5.py", EAGLE3))
TABLE.register(("nemotron_h",), _row("NemotronHForCausalLM", "modeling_nemotron_h.py", EAGLE3))
TABLE.register(("gemma3",), _row("Gemma3Model", "modeling_gemma3vl.py; its Gemma3DecoderLayer in modeling_gemma3.py "
                                                 "takes no spec_metadata", NONE))
TABLE.register(("falcon_h1",), _row("FalconH1ForCausalLM",
                                    "modeling_falcon_h1.py: its model passes no spec_metadata to its layers", NONE))
TABLE.register(("lfm2",), {SNAPSHOT: None})
TABLE.register(("granitemoehybrid",), {SNAPSHOT: None})
TABLE.register(("kimi_linear",), _row(
    "KimiLinearForCausalLM", "modeling_kimi_linear.py at cf328e8", NONE,
    "is the Kimi K3 runtime: it requires routed_expert_hidden_size (latent MoE) and attn_res_block_size, which a "
    "kimi_linear config does not have"))
_NO_LLM_SPEC = "its forward calls self.llm.forward without spec_metadata"
TABLE.register(("qwen2_5_vl",), _row("Qwen2_5_VLModel", f"modeling_qwen2vl.py: {_NO_LLM_SPEC}", NONE))
TABLE.register(("qwen3_vl",), _row("Qwen3VLModelBase", f"modeling_qwen3vl.py: {_NO_LLM_SPEC}", NONE))
TABLE.register(("qwen3_vl_moe",), _row("Qwen3MoeVLModel (Qwen3VLModelBase)",
                                       f"modeling_qwen3vl_moe.py at 14b0c8f: {_NO_LLM_SPEC}", NONE))
TABLE.register(("llama4",), _row("Llama4ForConditionalGeneration", "modeling_llama.py at 3a5901c", EAGLE3))
