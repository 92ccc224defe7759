"""Drafter kinds an engine serves, or will serve, that draftsmith does not export to it, each with the one-line
reason `draftsmith export` prints (found by reading the engine's source; docs/export.md, "Block drafters in
SGLang and TensorRT-LLM", says where).

TensorRT-LLM: DFlash (PR #12794, `DFlashDecodingConfig`, tensorrt_llm/_torch/speculative/dflash.py) and DSpark
(`DSparkDecodingConfig`, _torch/speculative/dspark.py) are in its main branch and documented for the 1.3.0rc and
1.4.0rc pre-releases only; the newest stable release on PyPI is 1.2.1 (1.2.0, March 2026, predates PR #12794),
and PyPI ships it as an sdist that fetches the wheel from NVIDIA's index, which this project cannot read, so no
released loader could be checked.
"""
from __future__ import annotations

_TRTLLM_PRERELEASE = ("TensorRT-LLM's {name} drafter ({config}, tensorrt_llm/_torch/speculative/{file}) exists only "
                      "in the 1.3.0rc / 1.4.0rc pre-releases, not in the stable 1.2.x, so draftsmith has no released "
                      "loader to check the export against; export it with {fits}")

GAPS: dict[tuple[str, str], dict] = {
    ("trtllm", "dflash"): {"name": "DFlash", "config": "DFlashDecodingConfig, PR #12794", "file": "dflash.py"},
    ("trtllm", "dspark"): {"name": "DSpark", "config": "DSparkDecodingConfig", "file": "dspark.py"},
}


def engine_gap(fmt: str, kind: str, fits: list[str]) -> str | None:
    """The one-line reason `--to fmt` refuses `kind` when the engine has (or will have) such a drafter; None when
    draftsmith knows of none (the generic refusal applies)."""
    gap = GAPS.get((fmt, kind))
    if gap is None:
        return None
    return _TRTLLM_PRERELEASE.format(**gap, fits=" or ".join(f"--to {f}" for f in fits) or "no other format")
