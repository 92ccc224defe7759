"""`draftsmith eval`'s options are declared once (issue 31, item 3): each EvalOptions field is exactly one flag,
the flags parse back into EvalOptions, and the flags' help, defaults, types and choices come from the fields."""
from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from draftsmith.commands import eval as eval_cli
from draftsmith.core.flags import add_flags, flag, flag_fields, flag_name, from_namespace
from draftsmith.eval.options import EvalOptions


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    eval_cli.add_arguments(p)
    return p


def test_every_field_is_exactly_one_flag():
    actions = [a for a in parser()._actions if a.dest != "help"]
    assert [a.dest for a in actions] == [f.name for f in dataclasses.fields(EvalOptions)]
    assert flag_fields(EvalOptions) == list(dataclasses.fields(EvalOptions))  # no field without its flag
    for field, action in zip(dataclasses.fields(EvalOptions), actions):
        assert (action.option_strings or [action.dest]) == [flag_name(field)]
        assert action.default == field.default, field.name


def _unusual(field: dataclasses.Field, action: argparse.Action) -> tuple[list[str], object]:
    """Command-line words setting `field` to a value other than its default, and that value."""
    name = flag_name(field)
    if action.nargs == 0:  # store_true
        return [name], True
    if action.choices:
        value = next(c for c in action.choices if c != field.default)
    elif action.type in (int, float):
        value = action.type(field.default or 0) + 3
    elif action.type is Path:
        value = Path(f"somewhere/{field.name}")
    else:
        value = f"value-of-{field.name}"
    words = [str(value)] if not action.option_strings else [name, str(value)]
    return words, value


def test_parsed_flags_round_trip_into_eval_options():
    p = parser()
    actions = {a.dest: a for a in p._actions}
    argv, expected = [], {}
    for field in dataclasses.fields(EvalOptions):
        words, expected[field.name] = _unusual(field, actions[field.name])
        argv += words
    options = EvalOptions.from_args(p.parse_args(argv))
    assert options == EvalOptions(**expected)
    assert all(getattr(options, n) != f.default for n, f in EvalOptions.__dataclass_fields__.items())
    assert EvalOptions.from_args(p.parse_args([])) == EvalOptions()  # no flag: the fields' defaults


def test_bad_flag_values_are_refused_by_argparse_as_before(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--k", "five"])
    assert "argument --k: invalid int value: 'five'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parser().parse_args(["--tree", "bushy"])
    assert "argument --tree: invalid choice: 'bushy' (choose from 'dynamic', 'static')" in capsys.readouterr().err


def test_adding_an_option_is_one_field():
    @dataclass
    class Options:
        depth: int = flag(2, help="how deep")
        where: Optional[Path] = flag(None, help="a folder (%(default)s)")
        loud: bool = flag(False, help="say more")
        mode: str = flag("a", choices=lambda: ["a", "b"])
        path: Optional[str] = flag(None, positional=True, nargs="?")

    p = argparse.ArgumentParser()
    add_flags(p, Options)
    got = from_namespace(Options, p.parse_args(["x", "--depth", "7", "--where", "d", "--loud", "--mode", "b"]))
    assert got == Options(depth=7, where=Path("d"), loud=True, mode="b", path="x")
    assert from_namespace(Options, p.parse_args([])) == Options()
    helps = {a.dest: a.help for a in p._actions}
    assert helps["depth"] == "how deep" and {a.dest: a.choices for a in p._actions}["mode"] == ["a", "b"]
