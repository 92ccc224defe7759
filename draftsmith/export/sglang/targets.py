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
classes inherit their capture from srt/models/qwen3_vl.py).
"""
from __future__ import annotations

from draftsmith.export.engine_versions import RELEASES, TARGETS, TargetClass, TargetTable

M = "srt/models/"
_CAPTURE = "(srt/model_executor/model_runner_components/attention_backend_setup.py)"
_SHARE = "(srt/speculative/eagle_worker_v2.py, init_lm_head)"
NEEDS = {"eagle3": f"set_eagle3_layers_to_capture {_CAPTURE}",  # every class without it here; it also needs
         "eagle1": f"get_embed_and_head {_SHARE}",  # get_embed_and_head, as EAGLE-1 does
         "dflash": f"set_dflash_layers_to_capture {_CAPTURE}",
         "dspark": f"set_dspark_layers_to_capture and set_dflash_layers_to_capture {_CAPTURE}"}
ALL = frozenset(NEEDS)


def _row(cls: str, file: str, kinds=ALL) -> dict:
    return {"0.5.23": TargetClass(cls, M + file, frozenset(kinds))}


TABLE = TargetTable("sglang", "SGLang", "srt/models/: no EntryClass for it", RELEASES["sglang"], needs=NEEDS)
TARGETS["sglang"] = TABLE

TABLE.register(("qwen3_next",), _row("Qwen3NextForCausalLM", "qwen3_next.py"))
TABLE.register(("qwen3_5",), _row("Qwen3_5ForConditionalGeneration", "qwen3_5.py"))
TABLE.register(("qwen3_5_moe",), _row("Qwen3_5MoeForConditionalGeneration", "qwen3_5.py"))
TABLE.register(("qwen3_5_text",), _row("Qwen3_5ForCausalLM", "qwen3_5_text.py"))
TABLE.register(("qwen3_5_moe_text",), _row("Qwen3_5MoeForCausalLM", "qwen3_5_text.py"))
TABLE.register(("lfm2",), _row("Lfm2ForCausalLM", "lfm2.py", {"dflash", "dspark"}))
TABLE.register(("falcon_h1",), _row("FalconH1ForCausalLM", "falcon_h1.py", {"eagle1"}))
TABLE.register(("nemotron_h",), _row("NemotronHForCausalLM", "nemotron_h.py", {"eagle1", "dflash", "dspark"}))
TABLE.register(("granitemoehybrid",), _row("GraniteMoeHybridForCausalLM", "granitemoehybrid.py", ()))
TABLE.register(("kimi_linear",), _row("KimiLinearForCausalLM", "kimi_linear.py", {"dspark"}))
TABLE.register(("gemma3",), _row("Gemma3ForConditionalGeneration", "gemma3_mm.py", {"eagle3", "eagle1"}))
TABLE.register(("qwen2_5_vl",), _row("Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl.py", {"eagle3", "eagle1"}))
TABLE.register(("qwen3_vl",), _row("Qwen3VLForConditionalGeneration", "qwen3_vl.py"))
