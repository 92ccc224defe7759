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
from draftsmith.core.flags import FLAG, GROUP, add_flags, all_flags, flag, flag_dest, flag_name, from_namespace, group
from draftsmith.eval.options import EvalOptions, LlamacppOptions, NgramOptions


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    eval_cli.add_arguments(p)
    return p


def test_every_field_is_exactly_one_flag():
    actions = [a for a in parser()._actions if a.dest != "help"]
    flags = all_flags(EvalOptions)  # the n-gram and llama.cpp groups' flags in their groups' places
    assert [a.dest for a in actions] == [flag_dest(f) for _, f in flags]
    for cls in (EvalOptions, NgramOptions, LlamacppOptions):  # no field without its flag (or its group of flags)
        assert all(FLAG in f.metadata or GROUP in f.metadata for f in dataclasses.fields(cls)), cls
    for (_, field), action in zip(flags, actions):
        assert (action.option_strings or [action.dest]) == [flag_name(field)]
        assert action.default == field.default, field.name


def test_the_groups_keep_their_flat_flags():
    """The n-gram and llama.cpp options are groups in EvalOptions, the same flags as before on the command line."""
    names = {owner.__name__ + "." + f.name: flag_name(f) for owner, f in all_flags(EvalOptions)
             if owner is not EvalOptions}
    assert names == {"NgramOptions.max": "--ngram-max", "NgramOptions.min": "--ngram-min",
                     "NgramOptions.match": "--ngram-match", "NgramOptions.first": "--ngram-first",
                     "NgramOptions.drafter_k": "--drafter-k", "LlamacppOptions.export": "--engine-export",
                     "LlamacppOptions.target_gguf": "--target-gguf", "LlamacppOptions.threads": "--engine-threads",
                     "LlamacppOptions.compare": "--engine-compare"}
    options = EvalOptions.from_args(parser().parse_args(["--ngram-max", "5", "--ngram-first", "--drafter-k", "2",
                                                         "--engine-threads", "3", "--target-gguf", "t.gguf"]))
    assert options.ngram == NgramOptions(max=5, first=True, drafter_k=2)
    assert options.llamacpp == LlamacppOptions(threads=3, target_gguf="t.gguf")
    assert options.ngram.lookup() == {"max_ngram": 5, "min_ngram": 1, "match": "first"}
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.ngram.max = 4  # type: ignore[misc]  # a group changes as a whole (dataclasses.replace)


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
    for owner, field in all_flags(EvalOptions):
        words, expected[owner, field.name] = _unusual(field, actions[flag_dest(field)])
        argv += words

    def built(cls):
        return cls(**{f.name: built(f.metadata[GROUP]) if GROUP in f.metadata else expected[cls, f.name]
                      for f in dataclasses.fields(cls)})

    options = EvalOptions.from_args(p.parse_args(argv))
    assert options == built(EvalOptions)
    assert all(getattr(options if owner is EvalOptions else options.ngram if owner is NgramOptions else options.llamacpp,
                       f.name) != f.default for owner, f in all_flags(EvalOptions))
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


@dataclass(frozen=True)
class Lookup:  # a group of flags (at module level: the flags read the annotations by name)
    longest: int = flag(3, name="lookup_max", help="longest")
    fast: bool = flag(False)


@dataclass
class Grouped:
    depth: int = flag(2)
    lookup: Lookup = group(Lookup)
    path: Optional[str] = flag(None, positional=True, nargs="?")


def test_a_group_of_options_is_one_field_holding_its_flags():
    p = argparse.ArgumentParser()
    add_flags(p, Grouped)
    assert [a.option_strings or [a.dest] for a in p._actions][1:] == [["--depth"], ["--lookup-max"], ["--fast"], ["path"]]
    got = from_namespace(Grouped, p.parse_args(["x", "--lookup-max", "7", "--fast"]))
    assert got == Grouped(lookup=Lookup(longest=7, fast=True), path="x")
    assert from_namespace(Grouped, p.parse_args([])) == Grouped() and Grouped().lookup == Lookup()
