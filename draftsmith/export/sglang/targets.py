"""Which drafter kinds SGLang serves for the hybrid and vision-language targets (engine_versions.TARGETS).

Read from the sglang-0.5.23 wheel (paths inside sglang/):
  - EAGLE-3 needs the target class to define set_eagle3_layers_to_capture, DFlash set_dflash_layers_to_capture,
    DSpark set_dspark_layers_to_capture or else set_dflash_layers_to_capture
    (srt/model_executor/model_runner_components/attention_backend_setup.py, configure_aux_hidden_state_capture,
    raises otherwise).
  - EAGLE-3 and EAGLE-1 share the target's embedding (and EAGLE-1 its lm_head) through get_embed_and_head
    (srt/speculative/eagle_worker_v2.py init_lm_head -> srt/speculative/pp_draft_embedding.py, which re-raises the
    AttributeError of a target without it).
Each class is the one the model file's EntryClass registers, its methods read with its bases (Qwen3.5's VLM
classes and Qwen3VLMoeForConditionalGeneration (srt/models/qwen3_vl_moe.py) inherit their capture from
srt/models/qwen3_vl.py; the MoE language model's set_dflash_layers_to_capture is Qwen3MoeModel's, srt/models/qwen3_moe.py).
Llama-4 (llama4): srt/models/mllama4.py's Llama4ForConditionalGeneration defines set_eagle3_layers_to_capture (delegated
to its Llama4ForCausalLM, a LlamaForCausalLM) and get_embed_and_head, and no set_dflash_layers_to_capture.
"""
from __future__ import annotations

from draftsmith.core.registry import Registry
from draftsmith.export.engine_versions import RELEASES, TARGETS, Need, TargetClass, TargetTable

M = "srt/models/"
_CAPTURE = "(srt/model_executor/model_runner_components/attention_backend_setup.py)"
_SHARE = "(srt/speculative/eagle_worker_v2.py, init_lm_head)"
E3, DF, DS, EH = ("set_eagle3_layers_to_capture", "set_dflash_layers_to_capture", "set_dspark_layers_to_capture",
                  "get_embed_and_head")
ALL = frozenset({E3, DF, DS, EH})  # a class with every capture method and the shared embedding / head

NEEDS: Registry = Registry("SGLang target need")  # kind -> what the target's model class must have for it
NEEDS.register("eagle3")(Need(f"{E3} {_CAPTURE} (and {EH} {_SHARE})", all_of=frozenset({E3, EH})))
NEEDS.register("eagle1")(Need(f"{EH} {_SHARE}", all_of=frozenset({EH})))
NEEDS.register("dflash")(Need(f"{DF} {_CAPTURE}", all_of=frozenset({DF})))
NEEDS.register("dspark")(Need(f"{DS}, or {DF} as its fallback {_CAPTURE}", any_of=frozenset({DS, DF})))


def _row(cls: str, file: str, has=ALL) -> dict:
    return {"0.5.23": TargetClass(cls, M + file, frozenset(has))}


TABLE = TargetTable("sglang", "SGLang", "srt/models/: no EntryClass for it", RELEASES["sglang"],
                    needs=lambda kind: NEEDS.get(kind) if kind in NEEDS else None)
TARGETS["sglang"] = TABLE

TABLE.register(("qwen3_next",), _row("Qwen3NextForCausalLM", "qwen3_next.py"))
TABLE.register(("qwen3_5",), _row("Qwen3_5ForConditionalGeneration", "qwen3_5.py"))
TABLE.register(("qwen3_5_moe",), _row("Qwen3_5MoeForConditionalGeneration", "qwen3_5.py"))
TABLE.register(("qwen3_5_text",), _row("Qwen3_5ForCausalLM", "qwen3_5_text.py"))
TABLE.register(("qwen3_5_moe_text",), _row("Qwen3_5MoeForCausalLM", "qwen3_5_text.py"))
TABLE.register(("lfm2",), _row("Lfm2ForCausalLM", "lfm2.py", {DF}))
TABLE.register(("falcon_h1",), _row("FalconH1ForCausalLM", "falcon_h1.py", {EH}))
TABLE.register(("nemotron_h",), _row("NemotronHForCausalLM", "nemotron_h.py", {EH, DF}))
TABLE.register(("granitemoehybrid",), _row("GraniteMoeHybridForCausalLM", "granitemoehybrid.py", ()))
TABLE.register(("kimi_linear",), _row("KimiLinearForCausalLM", "kimi_linear.py", {DS}))
TABLE.register(("gemma3",), _row("Gemma3ForConditionalGeneration", "gemma3_mm.py", {E3, EH}))
TABLE.register(("qwen2_5_vl",), _row("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl.py", {E3, EH}))
TABLE.register(("qwen3_vl",), _row("Qwen3VLForConditionalGeneration", "qwen3_vl.py"))
TABLE.register(("qwen3_vl_moe",), _row("Qwen3VLMoeForConditionalGeneration", "qwen3_vl_moe.py", {E3, DF, EH}))
TABLE.register(("llama4",), _row("Llama4ForConditionalGeneration", "mllama4.py", {E3, EH}))
