"""Command-line flags declared on a dataclass: each field is one flag, so adding an option is one edit.

    @dataclass
    class Options:
        k: int = flag(5, help="draft tokens per round")
        path: Optional[str] = flag(None, positional=True, nargs="?", help="a checkpoint")

    add_flags(parser, Options)                # --k (type int, default 5), then the positional path
    options = from_namespace(Options, args)   # Options(k=..., path=...)

The flag is `--` + the field name with `_` as `-` (or `name`'s, when given); its default is the field's; its
argparse type comes from the annotation (Optional[X] -> X; bool -> store_true; str -> none). `help`, `choices`
and `metavar` may be callables, read when the parser is built (a registry filled later).

Options that belong together may sit in a group: a frozen dataclass of flag fields, held by one `group()` field.
Its flags stay flat on the command line, in declaration order, and parse back into the group:

    @dataclass(frozen=True)
    class Lookup:
        max: int = flag(3, name="ngram_max", help="longest n-gram")   # --ngram-max

    @dataclass
    class Options:
        k: int = flag(5)
        ngram: Lookup = group(Lookup)             # --k, then --ngram-max; options.ngram.max"""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Union

FLAG = "flag"  # the field metadata key holding the flag's argparse keywords
_TYPES = {int: int, float: float, Path: Path}
_LATE = ("help", "choices", "metavar")  # keywords that may be given as callables


GROUP = "flag_group"  # the field metadata key of a group field: the dataclass of the group's flags


def flag(default: Any, *, help: Any = None, positional: bool = False, about: str | None = None,
         name: str | None = None, **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also one command-line flag (keywords: those of argparse's add_argument; `about`: a
    short phrase messages may quote after the flag, e.g. "the draft GGUF's tensor type"; `name`: the flag's name,
    with `_` for `-`, where it is not the field's, e.g. a field `max` of an n-gram group that is --ngram-max)."""
    spec = {"help": help, "positional": positional, "about": about, "name": name, **argparse_kwargs}
    return dataclasses.field(default=default, metadata={FLAG: spec})


def group(cls: type) -> Any:
    """A dataclass field holding `cls`, a frozen dataclass of flag fields: its flags are flags of the dataclass
    that holds the group, in the group's place, and parse back into one `cls` (default: `cls()`)."""
    return dataclasses.field(default_factory=cls, metadata={GROUP: cls})


def flag_dest(field: dataclasses.Field) -> str:
    """The attribute the parsed flag sets on argparse's Namespace: `name` when given, else the field's name."""
    return field.metadata[FLAG]["name"] or field.name


def flag_name(field: dataclasses.Field) -> str:
    """The flag's name as users type it: `--tree-depth` for tree_depth, `path` for a positional."""
    dest = flag_dest(field)
    return dest if field.metadata[FLAG]["positional"] else "--" + dest.replace("_", "-")


def _plain_type(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(annotation) is Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def argparse_kwargs(cls: type, field: dataclasses.Field) -> dict:
    """The keywords add_argument gets for `field` of dataclass `cls`."""
    kwargs = {key: value for key, value in field.metadata[FLAG].items() if key not in ("positional", "about", "name")}
    for key in _LATE:
        if callable(kwargs.get(key)):
            kwargs[key] = kwargs[key]()
    if kwargs.get("help") is None:
        kwargs.pop("help")
    kind = _plain_type(typing.get_type_hints(cls)[field.name])
    if kind is bool:
        kwargs.setdefault("action", "store_true")
    elif kind in _TYPES:
        kwargs.setdefault("type", _TYPES[kind])
    kwargs["default"] = field.default
    return kwargs


def flag_fields(cls: type) -> list[dataclasses.Field]:
    """The fields of `cls` that are flags, in declaration order (its groups' flags: see all_flags)."""
    return [f for f in dataclasses.fields(cls) if FLAG in f.metadata]


def all_flags(cls: type) -> list[tuple[type, dataclasses.Field]]:
    """Every flag of dataclass `cls` as (the dataclass declaring it, its field), a group's flags in the group's
    place: the order of --help."""
    found = []
    for field in dataclasses.fields(cls):
        if GROUP in field.metadata:
            found += all_flags(field.metadata[GROUP])
        elif FLAG in field.metadata:
            found.append((cls, field))
    return found


def add_flags(parser, cls: type) -> None:
    """One add_argument per flag of dataclass `cls`, its groups' included."""
    for owner, field in all_flags(cls):
        parser.add_argument(flag_name(field), **argparse_kwargs(owner, field))


def from_namespace(cls: type, args: Any) -> Any:
    """The dataclass `cls` built from parsed flags (an argparse Namespace, or anything with the attributes),
    each group built from its own flags."""
    values = {}
    for field in dataclasses.fields(cls):
        if GROUP in field.metadata:
            values[field.name] = from_namespace(field.metadata[GROUP], args)
        elif FLAG in field.metadata:
            values[field.name] = getattr(args, flag_dest(field))
    return cls(**values)
