"""Every recipe validates; every debug recipe trains a few steps through the function API."""
from __future__ import annotations

from pathlib import Path

import pytest

from draftsmith import config
from draftsmith.cli import main as cli_main
from draftsmith.train.loop import train

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))
DEBUG = sorted((REPO / "recipes" / "debug").glob("*.yaml"))


def test_recipes_exist():
    assert (REPO / "recipes" / "quickstart.yaml") in RECIPES
    assert DEBUG, "recipes/debug/ holds no recipe"


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(REPO)))
def test_recipe_validates_and_has_header(recipe):
    cfg = config.load(recipe)
    header = recipe.read_text().splitlines()[0]
    assert header.startswith("#"), f"{recipe} must start with a comment header (what, launch command, hardware, result)"
    assert "draftsmith train" in recipe.read_text() or "torchrun" in recipe.read_text()
    assert cfg.name


def test_misspelled_key_gets_suggestion(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text((REPO / "recipes" / "quickstart.yaml").read_text() + "\ntrian:\n  lr: 1.0\n")
    assert cli_main(["validate", str(bad)]) == 1
    assert "did you mean 'train'" in capsys.readouterr().out


def test_print_config_resolves_gpu_recipe(capsys):
    assert cli_main(["train", str(REPO / "recipes" / "eagle3-llama3.1-8b.yaml"), "--print-config"]) == 0
    out = capsys.readouterr().out
    assert "meta-llama/Llama-3.1-8B-Instruct" in out and "draft_vocab_size: 32000" in out


@pytest.mark.parametrize("recipe", DEBUG + [REPO / "recipes" / "quickstart.yaml"], ids=lambda p: p.name)
def test_debug_recipe_trains_a_few_steps(recipe, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # recipes name ../shared relative to the repository root
    cfg = config.load(recipe)
    if cfg.target.path.startswith("../shared") or any(p.startswith("../shared") for p in cfg.data.path):
        from tests.conftest import shared_path

        shared_path("models", "stories260K-hf")
    overrides = ["train.max_steps=2", "train.batch_size=2", "train.eval_every=0", f"train.output_dir={tmp_path}/run",
                 "data.max_samples=16", "data.eval_samples=2", "logging.progress_bar=false"]
    if cfg.regenerate.output:
        overrides += [f"regenerate.output={tmp_path}/regen.jsonl", "regenerate.limit=6", "regenerate.max_new_tokens=16"]
    result = train(config.load(recipe, overrides))
    assert result.steps == 2 and (result.final_checkpoint / "drafter.safetensors").exists()
    assert all(loss == loss for loss in result.losses)  # finite, not NaN


def test_overrides_may_follow_flags(capsys):
    assert cli_main(["train", str(REPO / "recipes" / "quickstart.yaml"), "--print-config", "train.max_steps=7"]) == 0
    assert "max_steps: 7" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        cli_main(["train", str(REPO / "recipes" / "quickstart.yaml"), "--print-config", "--bogus"])
