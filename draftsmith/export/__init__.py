"""Export a trained drafter in the exact format a serving engine loads, validated first.

    from draftsmith.export import export
    result = export("runs/eagle3-llama3.1-8b/final", to="sglang", out="exported/sglang")
    print(result.serve_command)

One folder per engine (vllm/, sglang/, trtllm/, llamacpp/; hf.py beside them): each holds that engine's layouts,
its block-family layouts, its doctor reader and its tools, and registers its formats when imported. No engine
imports another: what several engines share has a home named for what it is (layout.py: options, files and the
Layout base; speculators.py: the speculators format vLLM and SGLang read; eagle_tensors.py: the EAGLE-1/3 tensor
helpers; doctor/: the doctor's argument parsing, contract and checks).

EXPORTERS maps a format name (vllm, sglang, trtllm, hf, llama.cpp) to its Exporter; each format registers the
exporter and one layout per kind it takes (`@layouts(format).register(KIND)`), and the reasons it refuses the
others (support.REFUSED). Adding a format is its folder (or file) plus its import below.
can_export(kind, format) is the one answer to "can this kind go to this format, and if not, why".
"""
from draftsmith.export import hf, llamacpp, sglang, trtllm, vllm  # noqa: F401  (register the formats and their layouts)
from draftsmith.export.api import ExportResult, export  # noqa: F401
from draftsmith.export.layout import EXPORTERS  # noqa: F401
from draftsmith.export.support import can_export, formats_for, refusals  # noqa: F401
