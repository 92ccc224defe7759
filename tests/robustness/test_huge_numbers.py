"""Robustness harness, issue 44: huge integers for every numeric recipe key and every numeric flag.

A 400-digit integer at a float key was an OverflowError traceback, at `eval --seed` a ValueError;
`--repeats` / `train.grad_accum` of 10^12 ran until killed, `train.batch_size=10^12` failed to allocate.
Here every numeric key of the recipe schema (each drafter kind's options included) and every numeric
flag of eval, profile, export, report, leaderboard and prepare gets one of HUGE; the sandbox asserts
one line naming it (or a clean run), within the CPU budget.

Generated inputs in CI: 30 recipe keys through `validate`, 12 through a 2-step `train`, 16 eval flags,
8 profile flags, 6 export flags, 4 report / leaderboard flags; fixed: the keys and flags of the issue."""
from __future__ import annotations

import dataclasses
import typing

import pytest
from hypothesis import given
from hypothesis import strategies as st

from draftsmith import config
from draftsmith.core.flags import all_flags, flag_name
from draftsmith.eval.options import EvalOptions
from draftsmith.heads import DRAFTERS
from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

HUGE = ["1000000000000", str(2**63), "9" * 400, "-" + "9" * 400, "1" + "0" * 320]
CKPT = world.CHECKPOINT
QUICK = 30  # CPU seconds: a refusal comes before anything heavy; an unbounded count would run on


def numeric_keys(cls, prefix: str = "") -> list[str]:
    """Every int / float key of a config dataclass (nested sections and Optional included, lists not)."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) in (list, dict):
            continue
        options = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if dataclasses.is_dataclass(options[0]):
            out += numeric_keys(options[0], f"{prefix}{f.name}.")
        elif options[0] in (int, float):
            out.append(f"{prefix}{f.name}")
    return out


RECIPE_KEYS = numeric_keys(config.RecipeConfig)
EAGLE3_KEYS = numeric_keys(DRAFTERS.get("eagle3").Config, "drafter.")
# keys whose huge value means a longer run, not a wrong one (train sets max_steps itself)
RUN_LENGTH = {"train.max_steps", "train.epochs"}
TRAIN_KEYS = [k for k in RECIPE_KEYS + EAGLE3_KEYS if k not in RUN_LENGTH]
TRAIN_TAIL = ["train.output_dir=runs/new", "train.max_steps=2"]


@harness_settings(30)
@given(key=st.sampled_from(RECIPE_KEYS + EAGLE3_KEYS), value=st.sampled_from(HUGE))
def test_validate_huge_integer_at_any_numeric_key(check, key, value):
    damage = S.Damage(f"recipe.yaml: {key} = {value[:20]}... ({len(value)} characters)",
                      lambda root: _set_raw(root / "recipe.yaml", key, value), ["recipe.yaml", key])
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2), seconds=QUICK), [damage])


def _set_raw(path, key: str, text: str) -> None:
    """key set to `text` as written (a YAML integer of any length), the rest of the recipe kept."""
    import yaml

    data = yaml.safe_load(path.read_text())
    S.set_key(data, key, "@@HUGE@@")
    path.write_text(yaml.safe_dump(data, sort_keys=False).replace("'@@HUGE@@'", text))


@harness_settings(12)
@given(key=st.sampled_from(TRAIN_KEYS), value=st.sampled_from(HUGE))
def test_train_huge_integer_override(check, key, value):
    check(Case(["train", "recipe.yaml", f"{key}={value}", *TRAIN_TAIL], names=[key], outputs=["runs/new"],
               seconds=60))


@pytest.mark.parametrize("key", ["train.lr", "train.min_lr_ratio", "train.weight_decay", "train.max_grad_norm",
                                 "drafter.step_decay", "drafter.hard_label_weight", "regenerate.timeout_s",
                                 "regenerate.top_p", "regenerate.temperature", "train.batch_size", "train.grad_accum"])
def test_train_known_huge_keys(check, key):
    """The keys of issue 44 items 10-12: refused (a float past 1.8e308, a batch or accumulation past its bound)."""
    check(Case(["train", "recipe.yaml", f"{key}={'9' * 400}", *TRAIN_TAIL], names=[key], outputs=["runs/new"],
               seconds=QUICK, expect_error=True))


# --------------------------------------------------------------------------- flags

EVAL_NUMERIC = sorted(flag_name(f) for owner, f in all_flags(EvalOptions)  # the n-gram and llama.cpp groups' too
                      if typing.get_type_hints(owner)[f.name] in (int, float, typing.Optional[int],
                                                                  typing.Optional[float]))
ENGINE_ONLY = {"--engine-threads"}  # refused without --engine before anything runs


@harness_settings(16)
@given(flag=st.sampled_from(EVAL_NUMERIC), value=st.sampled_from(HUGE))
def test_eval_huge_integer_flag(check, flag, value):
    check(Case(["eval", CKPT, *world.EVAL_FAST, flag, value, "--out", "out/r.json"], names=[flag, value[:40]],
               outputs=["out"], seconds=60))


@pytest.mark.parametrize("flag", ["--repeats", "--warmup", "--seed"])
def test_eval_known_huge_flags(check, flag):
    check(Case(["eval", CKPT, *world.EVAL_FAST, flag, "1000000000000", "--out", "out/r.json"], names=[flag],
               outputs=["out"], seconds=QUICK, expect_error=True))
    check(Case(["eval", CKPT, *world.EVAL_FAST, flag, "9" * 400, "--out", "out/r.json"], names=[flag],
               outputs=["out"], seconds=QUICK, expect_error=True))


PROFILE_BASE = ["profile", CKPT, "--workloads", f"jsonl:{world.PROMPTS}", "--k-max", "2", "--num-prompts", "1",
                "--max-new-tokens", "4", "--batches", "1", "--contexts", "16", "--repeats", "1",
                "--overhead-batch", "1", "--device", "cpu", "--out", "prof/p.json"]
PROFILE_NUMERIC = ["--k-max", "--num-prompts", "--max-new-tokens", "--repeats", "--overhead-batch", "--batches",
                   "--contexts", "--validate-batches"]


@harness_settings(8)
@given(flag=st.sampled_from(PROFILE_NUMERIC), value=st.sampled_from(HUGE))
def test_profile_huge_integer_flag(check, flag, value):
    check(Case([*PROFILE_BASE, flag, value], names=[flag], outputs=["prof"], seconds=60))


def test_profile_known_huge_repeats(check):
    check(Case([*PROFILE_BASE, "--repeats", "1000000000000"], names=["--repeats"], outputs=["prof"], seconds=QUICK,
               expect_error=True))


@harness_settings(6)
@given(flag=st.sampled_from(["--num-speculative-tokens", "--max-model-len", "--dspark-draft-topk"]),
       value=st.sampled_from(HUGE))
def test_export_huge_integer_flag(check, flag, value):
    check(Case(["export", CKPT, "--to", "vllm", "--out", "exp", flag, value], names=[flag], outputs=["exp"],
               seconds=60))


@harness_settings(4)
@given(argv=st.sampled_from([["report", world.RESULT, "--no-html"], ["leaderboard", world.RESULT, "--out", "lb"],
                             ["prepare", "recipe.yaml", "--dry-run"]]), value=st.sampled_from(HUGE))
def test_report_leaderboard_prepare_huge_integer_flag(check, argv, value):
    flag = "--limit" if argv[0] == "prepare" else "--k-max"
    check(Case([*argv, flag, value], names=[flag], outputs=["lb"], seconds=60, no_control=True))

