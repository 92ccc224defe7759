"""Robustness harness: bad recipes and key=value overrides through `validate`, `train` and
`prepare --dry-run`, in-process, each case in a forked child under a CPU-time and memory limit
(tests/robustness/sandbox.py says what is asserted).

Generated inputs per test in CI (DRAFTSMITH_HARNESS_EXAMPLES=N runs N random ones instead):
  validate: 40 bad values at recipe keys, 12 damaged documents (bytes), 12 damaged documents (YAML);
            fixed: 4 known YAML findings, a non-UTF-8 recipe
  train:    25 bad overrides on a 2-step run, 6 raw override texts, 8 bad init_from checkpoints;
            fixed: 9 known bad values, 2 known --nproc values
  prepare --dry-run: 15 bad overrides
Known findings of issue 22 have their own tests (they failed before the fixes).
"""
from __future__ import annotations

import math

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

RECIPE_KEYS = S.leaf_keys({**world.RECIPE, "drafter": {**world.RECIPE["drafter"], "aux_layer_ids": None},
                           "regenerate": {"max_new_tokens": 1, "timeout_s": 1, "limit": 1, "top_p": 1},
                           "features": {"mode": 1, "cache_dir": 1, "dtype": 1}})
# Keys a 2-step training run may get any value at (not its length, output place or network use).
TRAIN_KEYS = ["train.lr", "train.weight_decay", "train.seed", "train.betas", "train.max_grad_norm", "train.warmup_steps",
              "train.min_lr_ratio", "train.batch_size", "train.precision", "train.log_every", "train.save_every",
              "train.keep_last", "train.resume", "data.max_length", "data.eval_samples", "data.max_samples",
              "data.format", "data.path", "data.pack_length", "data.chat_template", "drafter.ttt_steps",
              "drafter.draft_vocab_size", "drafter.step_decay", "drafter.kind", "drafter.hard_label_weight",
              "target.dtype", "target.path", "features.dtype"]
TRAIN_TAIL = ["train.output_dir=runs/new", "train.max_steps=2"]


def known_value_finding(key: str, value) -> str | None:
    """The issue-22 finding a bad value at `key` hits, or None (then the open tests generate it)."""
    numbers = [v for v in (value if isinstance(value, list) else [value])
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if key.endswith("aux_layer_ids") and isinstance(value, list):
        return "1/8 (aux layer ids unsorted, repeated or two)"
    if any(isinstance(v, float) and (not math.isfinite(v) or abs(v) >= 1e300) for v in numbers):
        return "6 (non-finite and absurd values)"
    if key.endswith("ttt_steps") and any(v > 64 for v in numbers):
        return "9 (nothing bounds k)"
    if key == "train.seed" and any(v < 0 for v in numbers):
        return "low: train.seed=-1"
    if key in ("data.max_length", "data.pack_length") and any(v > 256 for v in numbers):
        return "low: data.max_length far past the target's positions"
    return None


def _override(key: str, value) -> str:
    return f"{key}={S.yaml_text(value)}"


# --------------------------------------------------------------------------- validate

@harness_settings(40)
@given(damage=S.yaml_value_damage("recipe.yaml", RECIPE_KEYS))
def test_validate_bad_values(check, damage):
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2)), [damage])


@harness_settings(12)
@given(damage=S.byte_damage("recipe.yaml", text_only=True))
def test_validate_damaged_bytes(check, damage):
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2)), [damage])


def test_validate_non_utf8_recipe(check):
    damage = S.Damage("recipe.yaml: non-UTF-8 bytes", lambda root: (root / "recipe.yaml").write_bytes(b"\x83`g\xa8"),
                      ["recipe.yaml"])
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2)), [damage])


KNOWN_YAML = ["bomb_value", "deep_list", "deep_map", "duplicate_key"]


@harness_settings(12)
@given(damage=S.yaml_structure_damage("recipe.yaml", [k for k in S.YAML_DOCUMENT_KINDS if k not in KNOWN_YAML]))
def test_validate_damaged_yaml(check, damage):
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2)), [damage])


@pytest.mark.parametrize("kind", KNOWN_YAML)
def test_validate_known_yaml_findings(check, kind):
    damage = S.yaml_document_damage("recipe.yaml", kind)
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2), seconds=10,
               expect_error=kind == "duplicate_key"), [damage])


# --------------------------------------------------------------------------- train

@st.composite
def train_override(draw, keys=TRAIN_KEYS):
    key = draw(st.sampled_from(keys))
    value = draw(S.bad_values)
    return key, value


def _train_case(overrides: list[str], names: list[str], **kw) -> Case:
    kw.setdefault("seconds", 60)
    return Case(["train", "recipe.yaml", *overrides, *TRAIN_TAIL], names=names, outputs=["runs/new"], **kw)


@harness_settings(25)
@given(pair=train_override().filter(lambda kv: known_value_finding(*kv) is None))
def test_train_bad_overrides(check, pair):
    key, value = pair
    check(_train_case([_override(key, value)], [key] + ([value] if isinstance(value, str) and value else [])))


@harness_settings(6)
@given(text=S.flag_texts)
def test_train_override_raw_text(check, text):
    """The right-hand side as typed (not YAML-dumped): unbalanced brackets, control characters, empty."""
    check(_train_case([f"train.warmup_steps={text}"], ["train.warmup_steps"]))


KNOWN_TRAIN = [("train.lr", float("inf"), "6"), ("train.lr", 1e308, "6"), ("train.weight_decay", 1e300, "6"),
               ("drafter.aux_layer_ids", [3, 1, 2], "1"), ("drafter.aux_layer_ids", [1, 1, 2], "8"),
               ("drafter.ttt_steps", 10000, "9"),  # [1, 3] trains (block kinds take any count); exports refuse it
               ("train.seed", -1, "low: train.seed=-1"), ("data.max_length", 100000, "low: data.max_length")]


@pytest.mark.parametrize("key, value, finding", KNOWN_TRAIN, ids=[f"{k}={v}" for k, v, _ in KNOWN_TRAIN])
def test_train_known_value_findings(check, key, value, finding):
    check(_train_case([_override(key, value)], [key], expect_error=True, label=f"finding {finding}", seconds=15))


@harness_settings(8)
@given(damage=st.one_of(S.byte_damage("runs/base/final/drafter.json"),
                        S.byte_damage("runs/base/final/drafter.safetensors"),
                        S.json_damage("runs/base/final/drafter.json", [("kind",), ("options",), ("feature_layers",)])))
def test_train_bad_init_from(check, damage):
    check(_train_case(["train.init_from=runs/base/final"], damage.names + ["train.init_from", "runs/base/final"]),
          [damage])


# --------------------------------------------------------------------------- prepare --dry-run

@harness_settings(15)
@given(pair=train_override(TRAIN_KEYS + ["features.shard_rows", "features.build_batch_size", "features.cache_dir",
                                         "data.num_proc", "data.text_chunk_tokens"])
       .filter(lambda kv: known_value_finding(*kv) is None))
def test_prepare_dry_run_bad_overrides(check, pair):
    key, value = pair
    check(Case(["prepare", "recipe.yaml", "--dry-run", _override(key, value)], names=[key], seconds=60))


@pytest.mark.parametrize("nproc", ["0", "-3"])
def test_train_known_nproc_findings(check, nproc):
    check(Case(["train", "recipe.yaml", "--nproc", nproc, *TRAIN_TAIL], names=["--nproc"], outputs=["runs/new"],
               expect_error=True, seconds=30))


# --------------------------------------------------------------------------- drafter options written twice (issue 44)

def _both_spellings(key: str, flat, nested):
    def apply(root):
        data = yaml.safe_load((root / "recipe.yaml").read_text())
        data["drafter"][key] = flat
        data["drafter"].setdefault("options", {})[key] = nested
        (root / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    return apply


@harness_settings(6)
@given(key=st.sampled_from(["ttt_steps", "draft_vocab_size", "step_decay", "num_heads"]),
       values=st.tuples(st.sampled_from([1, 2, 5, 64]), st.sampled_from([1, 2, 5, 64])).filter(lambda v: v[0] != v[1]))
def test_validate_drafter_option_written_twice(check, key, values):
    """`drafter.KEY` beside kind and `drafter.options.KEY` with two values: refused naming the key (the flat
    one silently won)."""
    damage = S.Damage(f"recipe.yaml: drafter.{key}={values[0]}, drafter.options.{key}={values[1]}",
                      _both_spellings(key, *values), ["recipe.yaml", f"drafter.{key}"])
    check(Case(["validate", "recipe.yaml"], names=damage.names, named_at=(1, 2), expect_error=True, seconds=30),
          [damage])
