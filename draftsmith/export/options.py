"""Export options that only some formats, or some layouts, read: given to another, `draftsmith export` refuses
them in one line naming who reads them (found from the registries: Exporter.own_options, Layout.own_options)."""
from __future__ import annotations

from draftsmith.core.errors import UserError
from draftsmith.export.layout import EXPORTERS, ExportOptions, layouts

# ExportOptions field -> (its flag, whether `opts` sets it, what it is for)
FLAGS = {
    "max_model_len": ("--max-model-len", lambda o: o.max_model_len is not None, " (a draft LM with a shorter context)"),
    "target_gguf": ("--target-gguf", lambda o: o.target_gguf is not None, ""),
    "gguf_type": ("--gguf-type", lambda o: o.gguf_type is not None, " (the draft GGUF's tensor type)"),
    "adaptive_verification": ("--no-adaptive-verification", lambda o: not o.adaptive_verification,
                              " (vLLM's DSpark speculative-config fields)"),
    "dspark_draft_topk": ("--dspark-draft-topk", lambda o: o.dspark_draft_topk is not None,
                          " (vLLM's DSpark speculative-config fields)"),
}


def format_owners(field: str) -> list[str]:
    return [f for f in EXPORTERS.names() if field in EXPORTERS.get(f).own_options]


def layout_owners(field: str) -> list[tuple[str, str]]:
    return [(f, k) for f in EXPORTERS.names() for k in layouts(f).names() if field in layouts(f).get(k).own_options]


def refuse_format_options(fmt: str, opts: ExportOptions) -> None:
    """A format option given to a format that does not read it (before anything is loaded)."""
    exporter = EXPORTERS.get(fmt)
    for field, (flag, given, note) in FLAGS.items():
        owners = format_owners(field)
        if owners and given(opts) and field not in exporter.own_options:
            raise UserError(f"{flag} applies to {' or '.join(f'--to {f}' for f in owners)}{note}, not --to {fmt}")


def refuse_layout_options(fmt: str, kind: str, opts: ExportOptions) -> None:
    """A layout option given to another layout (once the kind is known)."""
    own = layouts(fmt).get(kind).own_options if kind in layouts(fmt) else frozenset()
    for field, (flag, given, note) in FLAGS.items():
        owners = layout_owners(field)
        if owners and given(opts) and field not in own:
            who = " or ".join(f"--to {f} exports of {k} drafters" for f, k in owners)
            raise UserError(f"{flag} applies to {who}{note}, not to --to {fmt} {kind}: drop the flag")
