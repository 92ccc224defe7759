"""Issue 34 (trust, round 4), recipes: bounded in bytes, keys and the length of what an error quotes;
`drafter.options` of the wrong type and a recipe that is a FIFO are one line naming them."""
from __future__ import annotations

import os
import time

import pytest
import yaml

from draftsmith import cli, config
from draftsmith.core import safe_yaml

BASE = {"target": {"path": "builtin:pycode-tiny"}, "drafter": {"kind": "eagle3"}}


def _recipe(tmp_path, data=None, text=None):
    path = tmp_path / "r.yaml"
    path.write_text(text if text is not None else yaml.safe_dump(data))
    return path


def test_a_50mb_scalar_is_refused_quickly(tmp_path, capsys):
    path = _recipe(tmp_path, text="target:\n  path: " + "x" * (50 * 2**20) + "\n")
    start = time.monotonic()
    assert cli.main(["validate", str(path)]) == 1
    assert time.monotonic() - start < 5
    out = capsys.readouterr().out
    assert "r.yaml" in out and "more than the 1,048,576" in out and len(out) < 1000


def test_45000_unknown_keys_are_refused_quickly_and_briefly(tmp_path, capsys):
    data = dict(BASE, train={f"key{i}": i for i in range(45_000)})
    path = _recipe(tmp_path, data)
    start = time.monotonic()
    assert cli.main(["validate", str(path)]) == 1
    assert time.monotonic() - start < 5
    out = capsys.readouterr().out
    assert "more than 2,000 keys" in out and len(out) < 2000


def test_many_unknown_keys_within_the_bound_are_listed_up_to_50(tmp_path):
    data = dict(BASE, train={f"key{i}": i for i in range(1500)})
    with pytest.raises(config.ConfigError) as info:
        config.load(_recipe(tmp_path, data))
    assert len(info.value.problems) == 51 and info.value.problems[-1] == "... and 1450 more problem(s)"


def test_a_50000_character_key_is_quoted_short(tmp_path):
    long_key = "k" * 50_000
    with pytest.raises(config.ConfigError) as info:
        config.load(_recipe(tmp_path, dict(BASE, train={long_key: 1})))
    assert "unknown key 'train.kkk" in str(info.value) and len(str(info.value)) < 1000
    text = f"train:\n  ? {long_key}\n  : 1\n  ? {long_key}\n  : 2\n"  # explicit keys: no 1,024-character limit
    with pytest.raises(safe_yaml.YAMLBoundError) as info:
        safe_yaml.load(text, "r.yaml")
    assert "given twice" in str(info.value) and len(str(info.value)) < 400


@pytest.mark.parametrize("options", [5, [1, 2], "x"])
def test_drafter_options_of_the_wrong_type_name_the_key(tmp_path, options):
    data = {"target": {"path": "builtin:pycode-tiny"}, "drafter": {"kind": "eagle3", "options": options}}
    with pytest.raises(config.ConfigError, match="drafter.options"):
        config.load(_recipe(tmp_path, data))


def test_a_recipe_that_is_a_fifo_is_one_line(tmp_path, capsys):
    os.mkfifo(tmp_path / "r.yaml")
    assert cli.main(["validate", str(tmp_path / "r.yaml")]) == 1
    assert "FIFO" in capsys.readouterr().out
