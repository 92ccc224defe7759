"""The formats' own flags, found from the registries: each Exporter declares a Flags dataclass (core/flags.py fields);
`draftsmith export` adds every format's flags to its command line, and a flag given to a format that does not
declare it, or to a layout of that format that does not read it (Layout.own_options), is refused in one line
naming who reads it."""
from __future__ import annotations

import dataclasses

from draftsmith.core.errors import UserError
from draftsmith.core.flags import FLAG, flag_fields, flag_name
from draftsmith.export.layout import EXPORTERS, ExportOptions, layouts


@dataclasses.dataclass(frozen=True)
class FormatFlag:
    fmt: str  # the format that declares it
    field: dataclasses.Field  # its Flags field

    @property
    def name(self) -> str:
        return self.field.name

    @property
    def flag(self) -> str:
        return flag_name(self.field)

    @property
    def about(self) -> str:
        about = self.field.metadata[FLAG].get("about")
        return f" ({about})" if about else ""


def format_flags() -> list[FormatFlag]:
    """Every format's own flags, format by format in registry order, each in its Flags' declaration order."""
    declared = [(fmt, EXPORTERS.get(fmt).Flags) for fmt in EXPORTERS.names()]
    return [FormatFlag(fmt, field) for fmt, flags in declared if flags is not None for field in flag_fields(flags)]


def given_flags(opts: ExportOptions) -> dict:
    """{field: value} of the format flags `opts` sets to something other than their defaults."""
    flags = opts.flags
    if dataclasses.is_dataclass(flags):
        values = {f.name: getattr(flags, f.name) for f in dataclasses.fields(flags)}
        defaults = {f.name: f.default for f in dataclasses.fields(flags)}
        return {k: v for k, v in values.items() if v != defaults[k]}
    if not isinstance(flags, dict):
        raise UserError(f"ExportOptions.flags must be a mapping of flag names to values, not {type(flags).__name__}")
    defaults = {f.name: f.field.default for f in format_flags()}
    return {k: v for k, v in flags.items() if k not in defaults or v != defaults[k]}


def _layout_readers(name: str) -> list[tuple[str, str]]:
    return [(f, k) for f in EXPORTERS.names() for k in layouts(f).names() if name in layouts(f).get(k).own_options]


def _owners(name: str) -> list[FormatFlag]:
    return [f for f in format_flags() if f.name == name]


def own_flags(fmt: str, given: dict) -> dict:
    """The part of `given` that format `fmt` declares (its Exporter.Flags fields)."""
    own = EXPORTERS.get(fmt).Flags
    names = {f.name for f in dataclasses.fields(own)} if own is not None else set()
    return {k: v for k, v in given.items() if k in names}


def refuse_format_options(fmt: str, given: dict) -> None:
    """A format flag (`given`: given_flags(opts)) given to a format that does not declare it (before anything is
    loaded); flags that only some layouts read wait for the kind (refuse_layout_options)."""
    own_names = set(own_flags(fmt, given))
    for name in given:
        if name in own_names:
            continue
        owners = _owners(name)
        if not owners:
            known = ", ".join(f.flag for f in format_flags())
            raise UserError(f"export option {name!r} is no format's flag (the formats' own flags: {known})")
        if _layout_readers(name):
            continue  # read by some layouts only: refused once the kind is known (refuse_layout_options)
        who = " or ".join(f"--to {f.fmt}" for f in owners)
        raise UserError(f"{owners[0].flag} applies to {who}{owners[0].about}, not --to {fmt}")


def refuse_layout_options(fmt: str, kind: str, given: dict) -> None:
    """A format flag (`given`: given_flags(opts)) given to a layout that does not read it (once the kind is known)."""
    if kind not in layouts(fmt):
        return
    own = layouts(fmt).get(kind).own_options
    for name in given:
        readers = _layout_readers(name)
        if not readers or name in own:
            continue  # a flag every layout of its format reads
        flag = _owners(name)[0]
        who = " or ".join(f"--to {f} exports of {k} drafters" for f, k in readers)
        raise UserError(f"{flag.flag} applies to {who}{flag.about}, not to --to {fmt} {kind}: drop the flag")
