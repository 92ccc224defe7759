"""The one answer to "can drafter kind K go to export format F (at engine release V, for a target of config C),
and if not, why": can_export. `draftsmith export`, inspect, ls and the architecture matrix all ask it. Its
inputs, each registered where the fact lives:
  - the format's layouts, registered per kind in the format's file (common.layouts); none: the format's
    one-line refusal (layout.REFUSED: an engine's draft format draftsmith does not write yet, or a
    drafter the engine does not have), else the generic one (common.not_taken);
  - the engine releases that serve the kind (engine_versions.SERVING, per (engine, kind));
  - for a target config: the kind's own refusals (heads.refusals: rope, an unreadable config), the
    layout's (Layout.refusals: e.g. SGLang's aux ids name layer outputs, llama.cpp's feature capture), and
    the engine's per-target table at that release (engine_versions.TARGETS, registered by
    export/<engine>/targets.py: the model class of a hybrid or vision-language target and the kinds it serves).
"""
from __future__ import annotations

from draftsmith import heads
from draftsmith.core.errors import UserError
from draftsmith.export import engine_versions
from draftsmith.export.layout import EXPORTERS, layouts, not_taken


def can_export(kind: str, fmt: str, engine_version: str | None = None, target_config=None) -> list[str]:
    """Why a `kind` drafter cannot be exported as `fmt` for engine release `engine_version` (None: the newest
    release read, the export's default) and, when given, a target of transformers config `target_config`;
    [] when it can. Each reason is one line, as `draftsmith export` prints it."""
    if target_config is not None:
        reasons = heads.refusals(target_config, kind)
        if reasons:
            return reasons
    if fmt not in EXPORTERS:
        return [f"--to {fmt}: no such export format (formats: {', '.join(EXPORTERS.names())})"]
    why = not_taken(fmt, kind)
    if why:
        return [why]
    reasons = []
    if target_config is not None:
        exporter = EXPORTERS.get(fmt)
        reasons += layouts(fmt).get(kind)(fmt, exporter.engine, kind).refusals(target_config)
    try:
        version = engine_versions.resolve(fmt, engine_version)
        engine_versions.check(fmt, version, kind)
    except UserError as exc:
        return reasons + [str(exc)]  # the release serves no such drafter at all: that is the one answer
    if target_config is not None:  # the release serves the kind, but maybe not for this target's model class
        reasons += engine_versions.target_refusals(fmt, version, kind, target_config)
    return reasons


def formats_for(kind: str) -> list[str]:
    """The export formats that take drafter kind `kind` at some engine release read (sorted)."""
    return [fmt for fmt in EXPORTERS.names()
            if any(not can_export(kind, fmt, v) for v in engine_versions.versions(fmt) or [None])]


def refusals(config, kind: str, fmt: str | None = None) -> list[str]:
    """Why `kind` (exported as `fmt`, when given, at its newest engine release) cannot serve a target of
    transformers `config`; [] when it can."""
    if fmt is None:
        return heads.refusals(config, kind)
    return can_export(kind, fmt, None, config)


