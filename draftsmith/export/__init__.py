"""Export a trained drafter in the exact format a serving engine loads, validated first.

    from draftsmith.export import export
    result = export("runs/eagle3-llama3.1-8b/final", to="sglang", out="exported/sglang")
    print(result.serve_command)

EXPORTERS maps a format name (vllm, sglang, trtllm, hf) to its Exporter (one file each).
"""
from draftsmith.registry import Registry

EXPORTERS: Registry = Registry("export format")

from draftsmith.export import hf, sglang, trtllm, vllm  # noqa: E402,F401  (register the formats)
from draftsmith.export.api import ExportResult, export  # noqa: E402,F401


def formats_for(kind: str) -> list[str]:
    """The export formats whose exporter takes drafter kind `kind`."""
    return [name for name in EXPORTERS.names() if kind in EXPORTERS.get(name).kinds]
