"""Export a trained drafter in the exact format a serving engine loads, validated first.

    from draftsmith.export import export
    result = export("runs/eagle3-llama3.1-8b/final", to="sglang", out="exported/sglang")
    print(result.serve_command)

EXPORTERS maps a format name (vllm, sglang, trtllm, hf, llama.cpp) to its Exporter; each format's file
registers the exporter and one layout per kind it takes (`@layouts(format).register(KIND)`), and the reasons
it refuses the others (engine_gaps.REFUSED). Adding a format is its file plus its import below.
can_export(kind, format) is the one answer to "can this kind go to this format, and if not, why".
"""
from draftsmith.export import (  # noqa: F401  (register the formats and their layouts)
    eagle1,
    hf,
    llamacpp,
    llamacpp_block,
    sglang,
    sglang_block,
    trtllm,
    vllm,
    vllm_parallel,
)
from draftsmith.export.api import ExportResult, export  # noqa: F401
from draftsmith.export.common import EXPORTERS  # noqa: F401
from draftsmith.export.support import can_export, formats_for, refusals  # noqa: F401
