"""Which export formats take a drafter kind, and why a kind (exported in a format) cannot serve a
target: the kind's own refusals (heads.refusals: rope, an unreadable config) plus the format's
layout's (e.g. SGLang's and TensorRT-LLM's aux ids name layer outputs). inspect, the architecture
matrix and `draftsmith export` ask here; the answers come from the kind's class and the layouts."""
from __future__ import annotations

from draftsmith import heads
from draftsmith.export.common import EXPORTERS


def formats_for(kind: str) -> list[str]:
    """The export formats whose exporter has a layout for drafter kind `kind` (sorted)."""
    named = heads.DRAFTERS.get(kind).export_layouts if kind in heads.DRAFTERS else {}
    return [name for name in EXPORTERS.names() if name in named]


def refusals(config, kind: str, fmt: str | None = None) -> list[str]:
    """Why `kind` (exported as `fmt`, when given) cannot serve a target of transformers `config`; [] when it can."""
    reasons = heads.refusals(config, kind)
    if reasons or fmt is None:
        return reasons
    from draftsmith.export import engine_versions

    reasons = EXPORTERS.get(fmt)().layout(kind).refusals(config)
    try:  # the newest engine release read (the export's default --engine-version) must serve the kind
        engine_versions.check(fmt, engine_versions.resolve(fmt, None), kind)
    except ValueError as exc:
        reasons.append(str(exc))
    return reasons
