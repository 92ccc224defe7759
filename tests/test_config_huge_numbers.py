"""Huge integers at every numeric recipe key (issue 44 items 10 and 12): a 400-digit integer at a float
key (train.lr, drafter.step_decay, regenerate.timeout_s, ...) was an OverflowError traceback; at an
integer key it reached torch or range(). Each is one problem naming the key. train.batch_size=10^12
failed to allocate after 51 s and train.grad_accum=10^12 ran until killed: both are bounded."""
from __future__ import annotations

import dataclasses
import typing

import pytest

from draftsmith import cli, config
from draftsmith.core.bounds import MAX_BATCH_SIZE, MAX_GRAD_ACCUM
from draftsmith.core.errors import ConfigError
from draftsmith.heads import DRAFTERS

HUGE = 10**400


def numeric_keys(cls, prefix: str = "") -> list[tuple[str, type]]:
    """(dotted key, int or float) for every numeric field of a config dataclass, nested sections included."""
    out = []
    for f in dataclasses.fields(cls):
        tp = typing.get_type_hints(cls)[f.name]
        if typing.get_origin(tp) in (list, dict):
            continue  # train.betas: its entries are checked below
        options = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        if dataclasses.is_dataclass(options[0]):
            out += numeric_keys(options[0], f"{prefix}{f.name}.")
        elif options[0] in (int, float):
            out.append((f"{prefix}{f.name}", options[0]))
    return out


RECIPE_KEYS = numeric_keys(config.RecipeConfig)
DRAFTER_KEYS = sorted({(kind, key, tp) for kind in DRAFTERS.names()
                       for key, tp in numeric_keys(DRAFTERS.get(kind).Config, "drafter.")})


def test_the_schema_walk_finds_the_keys_of_the_issue():
    keys = {k for k, _ in RECIPE_KEYS}
    assert {"train.lr", "train.min_lr_ratio", "train.weight_decay", "train.max_grad_norm", "regenerate.timeout_s",
            "regenerate.top_p", "regenerate.temperature", "train.batch_size", "train.grad_accum"} <= keys
    assert {"drafter.step_decay", "drafter.hard_label_weight"} <= {k for _, k, _ in DRAFTER_KEYS}


@pytest.mark.parametrize("key, tp", RECIPE_KEYS, ids=[k for k, _ in RECIPE_KEYS])
@pytest.mark.parametrize("sign", [1, -1])
def test_a_400_digit_integer_at_any_recipe_key_is_one_problem(key, tp, sign):
    with pytest.raises(ConfigError) as caught:
        config.from_dict({"target": {"path": "builtin:pycode-tiny"}}, overrides=[f"{key}={sign * HUGE}"])
    assert [p for p in caught.value.problems if key in p and "401 digits" in p], caught.value.problems


@pytest.mark.parametrize("kind, key, tp", DRAFTER_KEYS, ids=[f"{k}:{key}" for k, key, _ in DRAFTER_KEYS])
def test_a_400_digit_integer_at_any_drafter_key_is_one_problem(kind, key, tp):
    with pytest.raises(ConfigError) as caught:
        config.from_dict({"drafter": {"kind": kind}}, overrides=[f"{key}={HUGE}"])
    assert [p for p in caught.value.problems if key in p and "401 digits" in p], caught.value.problems


def test_a_400_digit_integer_inside_a_list_of_floats():
    with pytest.raises(ConfigError, match=r"train.betas\[0\]: expected a finite number, got an integer of 401 digits"):
        config.from_dict({}, overrides=[f"train.betas=[{HUGE}, 0.9]"])


def test_a_huge_float_key_on_the_command_line_is_one_line(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text("target:\n  path: builtin:pycode-tiny\n")
    assert cli.main(["train", str(path), f"train.lr={HUGE}", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "train.lr: expected a finite number, got an integer of 401 digits" in err and "Traceback" not in err


@pytest.mark.parametrize("key, bound", [("train.batch_size", MAX_BATCH_SIZE), ("train.grad_accum", MAX_GRAD_ACCUM),
                                        ("features.build_batch_size", MAX_BATCH_SIZE),
                                        ("regenerate.batch_size", MAX_BATCH_SIZE),
                                        ("data.num_proc", config.MAX_NUM_PROC)])
def test_batch_sizes_and_grad_accum_are_bounded(key, bound):
    config.from_dict({}, overrides=[f"{key}={bound}"])  # the bound itself is allowed
    with pytest.raises(ConfigError, match=f"{key}: must be <= {bound:,}"):
        config.from_dict({}, overrides=[f"{key}={10**12}"])


@pytest.mark.parametrize("key", ["drafter.num_heads", "drafter.num_kv_heads", "drafter.head_dim",
                                 "drafter.intermediate_size"])
def test_draft_layer_shapes_are_bounded(key):
    """Found by the harness: drafter.num_kv_heads=10^12 passed the recipe check and failed to allocate."""
    with pytest.raises(ConfigError, match=f"{key}: must be <= "):
        config.from_dict({"drafter": {"kind": "eagle3"}}, overrides=[f"{key}={10**12}"])
