"""Issue 22 (trust, round 3), recipes and overrides: YAML aliases, nesting and repeated keys are
bounded, every message quotes a bounded value, a non-UTF-8 recipe names its file, and values that
mean nothing (inf, 1e308, a negative seed) are errors naming their key."""
from __future__ import annotations

import json
import time

import pytest
import yaml

from draftsmith import checkpoint as ckpt_io
from draftsmith import cli, config
from draftsmith.eval import workloads


def _bomb(levels: int, key: str = "lr") -> str:
    """`levels` lists of nine aliases of the list before: 9**levels values from a few hundred bytes."""
    lines = ["train:", f"  {key}:", "    - &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    for i in range(1, levels):
        lines.append(f"    - &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


def test_an_alias_bomb_in_a_recipe_is_refused_before_it_expands(tmp_path, capsys):
    recipe = tmp_path / "bomb.yaml"
    recipe.write_text(_bomb(9))  # the 9 x 9: 387 million values once expanded
    assert len(recipe.read_bytes()) < 600
    start = time.process_time()  # CPU time: a busy machine does not change it (issue 34)
    with pytest.raises(config.ConfigError, match=r"aliases \(\*name\) expand to more than 100,000 values") as info:
        config.load(recipe)
    assert time.process_time() - start < 5
    assert len(str(info.value)) < 400
    assert cli.main(["validate", str(recipe)]) == 1  # validate's contract: 1 when a recipe is invalid
    assert "aliases" in capsys.readouterr().out


def test_an_alias_bomb_in_an_override_or_a_received_config_yaml_is_refused(tmp_path):
    flow = "[" + ", ".join(["&a [1, 1, 1, 1, 1, 1, 1, 1, 1]"] + ["*a"] * 8) + "]"
    with pytest.raises(config.ConfigError):  # small: within the bound, but not a number
        config.from_dict({}, overrides=[f"train.lr={flow}"])
    big = _bomb(7).split("\n", 2)[2].replace("    - ", "").replace("\n", ", ")
    with pytest.raises(config.ConfigError, match="override train.lr: its aliases"):
        config.from_dict({}, overrides=[f"train.lr=[{big.rstrip(', ')}]"])
    ckpt = tmp_path / "received"
    ckpt.mkdir()
    (ckpt / "config.yaml").write_text(_bomb(9))
    with pytest.raises(ValueError, match=r"config.yaml: its aliases"):
        ckpt_io.read_config(ckpt)
    with pytest.raises(ValueError, match=r"config.yaml: its aliases"):
        workloads.checkpoint_recipe(ckpt)  # eval reads the training prompt format from it


def test_every_message_quotes_a_bounded_value():
    """A legal (unaliased) but huge value: the message quotes a few elements, not all of them."""
    for raw in ({"train": {"lr": list(range(50_000))}}, {"train": {"output_dir": {"x": "y" * 100_000}}},
                {"data": {"format": "z" * 100_000}}, {"train": "q" * 100_000}):
        with pytest.raises(config.ConfigError) as info:
            config.from_dict(raw)
        assert len(str(info.value)) < 500, str(info.value)[:200]


def test_deep_nesting_in_a_recipe_is_one_problem_naming_the_file(tmp_path, capsys):
    recipe = tmp_path / "deep.yaml"
    recipe.write_text("train:\n  lr: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(config.ConfigError, match="(?s)deep.yaml: 1 problem.*nested deeper than 64 levels"):
        config.load(recipe)
    assert cli.main(["train", str(recipe)]) == 2
    assert "nested deeper" in capsys.readouterr().err
    with pytest.raises(config.ConfigError, match="nested"):
        config.from_dict({"train": {"lr": _nested(3000)}})  # a dict built in Python (e.g. from JSON)


def _nested(depth: int):
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


def test_a_repeated_key_is_an_error_naming_the_key_and_file(tmp_path):
    recipe = tmp_path / "twice.yaml"
    recipe.write_text("train:\n  lr: 0.1\n  max_steps: 3\n  lr: 0.001\n")
    with pytest.raises(config.ConfigError, match=r"(?s)twice.yaml.*key 'lr' is given twice \(line 2 and line 4\)"):
        config.load(recipe)
    ok = tmp_path / "ok.yaml"
    ok.write_text("base: &b {lr: 0.1}\n")  # a small alias stays legal YAML (then an unknown key here)
    with pytest.raises(config.ConfigError, match="unknown key 'base'"):
        config.load(ok)


def test_a_non_utf8_recipe_is_one_line_naming_the_file(tmp_path, capsys):
    recipe = tmp_path / "latin1.yaml"
    recipe.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert cli.main(["validate", str(recipe)]) == 1
    err = capsys.readouterr()
    text = err.out + err.err
    assert "latin1.yaml" in text and "not UTF-8" in text and "Traceback" not in text


@pytest.mark.parametrize("override, key", [
    ("train.lr=.inf", "train.lr"), ("train.lr=1e308", "train.lr"), ("train.lr=.nan", "train.lr"),
    ("train.weight_decay=1e300", "train.weight_decay"), ("train.max_grad_norm=.inf", "train.max_grad_norm"),
    ("train.seed=-1", "train.seed"), ("regenerate.seed=-5", "regenerate.seed"),
    ("data.max_length=100000000", "data.max_length"), ("regenerate.timeout_s=.inf", "regenerate.timeout_s"),
])
def test_non_finite_and_absurd_values_are_errors_naming_the_key(override, key):
    with pytest.raises(config.ConfigError) as info:
        config.from_dict({}, overrides=[override])
    assert any(p.startswith(f"{key}:") for p in info.value.problems), info.value.problems


def test_sensible_values_still_pass():
    cfg = config.from_dict({}, overrides=["train.lr=2e-4", "train.weight_decay=0.1", "train.seed=4294967295"])
    assert cfg.train.lr == 2e-4 and cfg.train.seed == 2**32 - 1
    assert yaml.safe_load(config.to_yaml(cfg))["train"]["weight_decay"] == 0.1


def test_deep_nesting_in_jsonl_is_one_line_naming_the_file_and_line(tmp_path):
    from draftsmith.data import regenerate

    prompts = tmp_path / "mine.jsonl"
    prompts.write_text(json.dumps({"prompt": "ok"}) + "\n" + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"mine.jsonl:2: not valid JSON \(nested too deeply\)"):
        workloads.load(f"jsonl:{prompts}")  # eval --workloads jsonl:PATH
    out = tmp_path / "regen.jsonl"  # a regeneration output damaged in the middle
    out.write_text("[" * 100_000 + "]" * 100_000 + "\n" + json.dumps({"id": "a"}) + "\n")
    with pytest.raises(ValueError, match=r"regen.jsonl:1: not a regeneration row \(.*\); the file is damaged"):
        regenerate.load_done(out)
