"""Counts a flag may ask for (issue 44 items 10 and 11): `eval --repeats` / `--warmup` and `profile --repeats`
of 10^12 ran until killed; `eval --seed` of 400 digits was a ValueError traceback. Each is one line
naming the flag, before anything loads."""
from __future__ import annotations

import argparse

import pytest

from draftsmith.cli import main as cli_main
from draftsmith.commands import profile
from draftsmith.core.bounds import MAX_REPEATS
from draftsmith.core.errors import UserError
from draftsmith.eval.options import EvalOptions, check_args

HUGE = 9 * 10**399


def _eval_options(**kw) -> EvalOptions:
    return EvalOptions(proposer="ngram", target="builtin:pycode-tiny", **kw)


@pytest.mark.parametrize("flag, value", [("repeats", 10**12), ("warmup", 10**12), ("repeats", HUGE), ("seed", HUGE),
                                         ("seed", -1), ("seed", 2**32)])
def test_eval_counts_and_seed_are_bounded(flag, value):
    with pytest.raises(UserError, match=f"--{flag} "):
        check_args(_eval_options(**{flag: value}))


def test_eval_bounds_themselves_are_allowed():
    check_args(_eval_options(repeats=MAX_REPEATS, warmup=MAX_REPEATS, seed=2**32 - 1))


def test_a_400_digit_seed_is_one_line(tmp_path, capsys):
    assert cli_main(["eval", "--proposer", "ngram", "--target", "builtin:pycode-tiny", "--seed", str(HUGE),
                     "--out", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seed (an integer of 400 digits)" in err, err


@pytest.mark.parametrize("value", [0, MAX_REPEATS + 1, 10**12])
def test_profile_repeats_is_bounded_before_anything_runs(monkeypatch, value):
    def reached(*a, **k):
        raise AssertionError("profile ran with an unbounded --repeats")
    monkeypatch.setattr(profile, "run", reached)
    parser = argparse.ArgumentParser()
    profile.add_arguments(parser)
    args = parser.parse_args(["runs/x/final", "--repeats", str(value)])
    want = "must be >= 1" if value < 1 else f"must lie in 1..{MAX_REPEATS:,}"  # below the range: the minimum
    with pytest.raises(UserError, match=f"--repeats {value}: {want}"):
        profile.main(args)


def test_eval_engine_seed_is_bounded(tmp_path, capsys):
    """`eval --engine llama.cpp` seeds torch with --seed as well: 400 digits are one line there too."""
    assert cli_main(["eval", str(tmp_path / "ckpt"), "--engine", "llama.cpp", "--seed", str(HUGE)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--seed (an integer of 400 digits)" in err, err
