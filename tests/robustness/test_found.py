"""Violations the harness found that issue 22 did not list, each as the case that found it (fixed
on this branch; /work/coord/harness-findings.md records them)."""
from __future__ import annotations

import json

from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.sandbox import Case


def test_a_recipe_integer_of_5000_digits_is_a_recipe_error(check):
    """Python refuses int("9" * 5000) with a ValueError that named no file (exit 2, no recipe named)."""
    damage = S.yaml_document_damage("recipe.yaml", "huge_int")
    out = check(Case(["validate", "recipe.yaml"], names=["recipe.yaml"], named_at=(1,)), [damage])
    assert out.code == 1 and "not valid YAML" in out.stdout


def test_an_override_that_is_not_yaml_names_the_key(check):
    """`train R train.warmup_steps=|x` printed yaml's ScannerError traceback."""
    out = check(Case(["train", "recipe.yaml", "train.warmup_steps=|\u00fc\u00c0"], names=["train.warmup_steps"]))
    assert out.code == 2 and "override train.warmup_steps" in out.stderr and "YAML" in out.stderr


def _bad_config_json(root) -> None:
    path = root / "target" / "config.json"
    cfg = json.loads(path.read_text())
    cfg["num_hidden_layers"] = float("nan")
    path.write_text(json.dumps(cfg))


def test_a_target_config_json_value_of_the_wrong_type_is_one_line(check):
    """transformers 5 refuses it with huggingface_hub's StrictDataclassError (not a ValueError): a traceback."""
    damage = S.Damage("target/config.json: num_hidden_layers = NaN", _bad_config_json, ["config.json"])
    out = check(Case(["eval", world.CHECKPOINT, *world.EVAL_FAST, "--out", "out/r.json"],
                     names=["target/config.json"], outputs=["out"]), [damage])
    assert out.code == 2 and "num_hidden_layers" in out.stderr
    out = check(Case(["inspect", "target"], names=["target/config.json"], named_at=(1,)), [damage])
    assert out.code == 1 and "num_hidden_layers" in out.stderr


def _time_per_round_list(root) -> None:
    path = root / world.RESULT
    data = json.loads(path.read_text())
    for wl in data["workloads"].values():
        wl["aggregate"]["time_per_round_s"] = [{}]
    path.write_text(json.dumps(data))


def test_a_result_section_of_the_wrong_type_is_a_malformed_result(check):
    """`time_per_round_s: [{}]` in a received result: AttributeError traceback in the speedup model."""
    damage = S.Damage("results/base.json: time_per_round_s = [{}]", _time_per_round_list, ["time_per_round_s"])
    for argv, outputs in ((["report", world.RESULT, "--no-html"], []), (["leaderboard", "results", "--out", "lb"], ["lb"])):
        out = check(Case(argv, names=["time_per_round_s"], outputs=outputs), [damage])
        assert out.code == 2 and world.RESULT in out.stderr


def test_a_target_config_json_that_is_not_an_object_is_one_line(check):
    """config.json holding `null`: transformers' TypeError traceback in inspect and eval."""
    damage = S.Damage("target/config.json = null", lambda root: (root / "target/config.json").write_text("null"),
                      ["config.json"])
    out = check(Case(["inspect", "target"], names=["target/config.json"], named_at=(1,)), [damage])
    assert out.code == 1 and "expected an object" in out.stderr
    out = check(Case(["eval", world.CHECKPOINT, *world.EVAL_FAST, "--out", "out/r.json"],
                     names=["target/config.json"], outputs=["out"]), [damage])
    assert out.code == 2 and "expected an object" in out.stderr


def test_a_tokenizer_json_that_is_not_utf8_names_the_tokenizer_files(check):
    """A non-UTF-8 tokenizer.json: `'utf-8' codec can't decode byte ...` with no file named."""
    def damage_tokenizer(root) -> None:
        path = root / "target/tokenizer.json"
        path.write_bytes(b"\x84" + path.read_bytes())

    damage = S.Damage("target/tokenizer.json: a non-UTF-8 first byte", damage_tokenizer, ["tokenizer.json"])
    out = check(Case(["eval", world.CHECKPOINT, *world.EVAL_FAST, "--out", "out/r.json"],
                     names=["tokenizer.json"], outputs=["out"]), [damage])
    assert out.code == 2


def test_a_special_token_that_is_an_object_names_the_tokenizer_files(check):
    """tokenizer_config.json with `"bos_token": {}`: transformers' TypeError traceback."""
    def damage_config(root) -> None:
        path = root / "target/tokenizer_config.json"
        data = json.loads(path.read_text())
        data["bos_token"] = {}
        path.write_text(json.dumps(data))

    damage = S.Damage("target/tokenizer_config.json: bos_token = {}", damage_config, ["tokenizer_config.json"])
    out = check(Case(["eval", world.CHECKPOINT, *world.EVAL_FAST, "--out", "out/r.json"],
                     names=["tokenizer_config.json"], outputs=["out"]), [damage])
    assert out.code == 2
    out = check(Case(["inspect", "target"], names=["tokenizer"], named_at=(1,)), [damage])
    assert out.code == 1
