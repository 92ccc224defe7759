"""Typed functions under the CLIs (issue 18): `draftsmith eval` is eval.evaluate.run(EvalOptions) and
`draftsmith profile` is eval.profile.run(path, ...); the commands only build their arguments from
argparse. The typed defaults must be the flags' defaults."""
from __future__ import annotations

import argparse
import inspect
import json

from draftsmith.commands import eval as eval_command
from draftsmith.commands import profile as profile_cli
from draftsmith.core.flags import all_flags, flag_dest
from draftsmith.eval import evaluate as eval_cli
from draftsmith.eval import profile


def parser_defaults(module) -> dict:
    p = argparse.ArgumentParser()
    module.add_arguments(p)
    return {a.dest: a.default for a in p._actions if a.dest != "help"}


def test_eval_options_carry_every_flag_with_its_default():
    flags = parser_defaults(eval_command)  # the flags live in the command, run in eval/evaluate.py
    typed = {flag_dest(f): f.default for _, f in all_flags(eval_cli.EvalOptions)}  # the groups' flags too
    assert typed == flags


def test_profile_run_defaults_are_the_flags_defaults():
    flags = parser_defaults(profile_cli)  # the flags live in the command, run in eval/profile.py
    sig = inspect.signature(profile.run).parameters
    ints = {"batches": flags["batches"], "contexts": flags["contexts"]}
    for name, text in ints.items():
        assert list(sig[name].default) == [int(x) for x in text.split(",")]
    assert list(sig["workload_names"].default) == flags["workloads"].split(",")
    for name in ("k_max", "num_prompts", "max_new_tokens", "repeats", "overhead_batch", "device", "out"):
        assert sig[name].default == flags[name], name
    assert list(sig["validate_batches"].default) == [] and flags["validate_batches"] == ""


def test_eval_run_is_the_command_as_a_function(tmp_path):
    """A typed call runs the same code as the command and returns the results it wrote."""
    out = tmp_path / "r.json"
    done = eval_cli.run(eval_cli.EvalOptions(target="builtin:pycode-tiny", proposer="ngram", workloads="pycode",
                                             k=3, num_prompts=2, max_new_tokens=16, repeats=3, check_lossless=True,
                                             out=out, device="cpu"))
    assert done.passed and done.path == out
    assert json.loads(out.read_text()) == json.loads(json.dumps(done.results))
    assert done.results["config"]["k"] == 3 and "pycode" in done.results["workloads"]
