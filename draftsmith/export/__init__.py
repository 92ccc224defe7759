"""Export a trained drafter in the exact format a serving engine loads, validated first.

    from draftsmith.export import export
    result = export("runs/eagle3-llama3.1-8b/final", to="sglang", out="exported/sglang")
    print(result.serve_command)

EXPORTERS maps a format name (vllm, sglang, trtllm, hf) to its Exporter (one file each); each format
registers one layout per kind under `layouts(format)` (a kind's class names its layout per format).
"""
from draftsmith.export import eagle1, hf, sglang, sglang_block, trtllm, vllm, vllm_parallel  # noqa: F401  (register the formats and layouts)
from draftsmith.export.api import ExportResult, export  # noqa: F401
from draftsmith.export.common import EXPORTERS  # noqa: F401
from draftsmith.export.support import formats_for, refusals  # noqa: F401
