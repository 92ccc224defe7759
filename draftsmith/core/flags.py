"""Command-line flags declared on a dataclass: each field is one flag, so adding an option is one edit.

    @dataclass
    class Options:
        k: int = flag(5, help="draft tokens per round")
        path: Optional[str] = flag(None, positional=True, nargs="?", help="a checkpoint")

    add_flags(parser, Options)                # --k (type int, default 5), then the positional path
    options = from_namespace(Options, args)   # Options(k=..., path=...)

The flag is `--` + the field name with `_` as `-`; its default is the field's; its argparse type comes
from the annotation (Optional[X] -> X; bool -> store_true; str -> none). `help`, `choices` and
`metavar` may be callables, read when the parser is built (a registry filled later)."""
from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any, Union

FLAG = "flag"  # the field metadata key holding the flag's argparse keywords
_TYPES = {int: int, float: float, Path: Path}
_LATE = ("help", "choices", "metavar")  # keywords that may be given as callables


def flag(default: Any, *, help: Any = None, positional: bool = False, about: str | None = None,
         **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also one command-line flag (keywords: those of argparse's add_argument; `about`: a
    short phrase messages may quote after the flag, e.g. "the draft GGUF's tensor type")."""
    spec = {"help": help, "positional": positional, "about": about, **argparse_kwargs}
    return dataclasses.field(default=default, metadata={FLAG: spec})


def flag_name(field: dataclasses.Field) -> str:
    """The flag's name as users type it: `--tree-depth` for tree_depth, `path` for a positional."""
    return field.name if field.metadata[FLAG]["positional"] else "--" + field.name.replace("_", "-")


def _plain_type(annotation: Any) -> Any:
    """Optional[X] -> X."""
    if typing.get_origin(annotation) is Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def argparse_kwargs(cls: type, field: dataclasses.Field) -> dict:
    """The keywords add_argument gets for `field` of dataclass `cls`."""
    kwargs = {key: value for key, value in field.metadata[FLAG].items() if key not in ("positional", "about")}
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
    """The fields of `cls` that are flags, in declaration order (the order of --help)."""
    return [f for f in dataclasses.fields(cls) if FLAG in f.metadata]


def add_flags(parser, cls: type) -> None:
    """One add_argument per flag field of dataclass `cls`."""
    for field in flag_fields(cls):
        parser.add_argument(flag_name(field), **argparse_kwargs(cls, field))


def from_namespace(cls: type, args: Any) -> Any:
    """The dataclass `cls` built from parsed flags (an argparse Namespace, or anything with the attributes)."""
    return cls(**{f.name: getattr(args, f.name) for f in flag_fields(cls)})
