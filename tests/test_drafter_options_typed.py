"""Drafter options are typed once (issue 31 item 3, issue 40 item 3): parsing a recipe builds the kind's Config
(heads/<kind>.py, config.typed_drafter_options) and the recipe's drafter section holds it; training, checkpoints
and exports read cfg.drafter.options and build nothing again. What is saved is that Config's mapping, and it
reads back to the same Config."""
from __future__ import annotations

import json

import pytest

from draftsmith import checkpoint, config, heads
from draftsmith.heads import DRAFTERS


def _count_config_builds(monkeypatch) -> list:
    """Record every drafter Config that config.build_dataclass builds."""
    built = []
    real = config.build_dataclass
    kinds = {DRAFTERS.get(k).Config for k in DRAFTERS.names()}

    def counting(cls, data, where=""):
        if cls in kinds:
            built.append(cls)
        return real(cls, data, where)

    monkeypatch.setattr(config, "build_dataclass", counting)
    return built


def test_a_recipe_types_its_drafter_options_once(monkeypatch):
    built = _count_config_builds(monkeypatch)
    cfg = config.from_dict({"drafter": {"kind": "medusa", "num_heads": 3}})
    assert built == [DRAFTERS.get("medusa").Config]  # parsing and the kind's range checks: one build
    assert isinstance(cfg.drafter.options, DRAFTERS.get("medusa").Config) and cfg.drafter.options.num_heads == 3
    assert len(built) == 1  # reading it builds nothing


def test_a_section_built_in_code_holds_its_kinds_defaults():
    assert config.RecipeConfig().drafter.options == DRAFTERS.get(heads.DEFAULT_KIND).Config()
    assert config.DrafterConfig("medusa").options == DRAFTERS.get("medusa").Config()


def test_range_problems_come_from_the_same_typed_options():
    with pytest.raises(config.ConfigError) as exc:
        config.from_dict({"drafter": {"kind": "eagle3", "ttt_steps": 0}, "train": {"lr": -1}})
    problems = exc.value.problems
    assert [p.split(":")[0] for p in problems] == ["train.lr", "drafter.ttt_steps"]  # common sections first


@pytest.mark.parametrize("kind", sorted(DRAFTERS.names()))
def test_options_survive_recipe_to_config_yaml_to_reload(kind, tmp_path):
    cfg = config.from_dict({"drafter": {"kind": kind, **DRAFTERS.get(kind).tiny_options}})
    typed = cfg.drafter.options
    assert isinstance(typed, DRAFTERS.get(kind).Config)
    assert config.to_dict(cfg)["drafter"]["options"] == config.options_mapping(typed)  # what config.yaml saves
    (tmp_path / "config.yaml").write_text(config.to_yaml(cfg))
    again = checkpoint.read_config(tmp_path)
    assert again.drafter.kind == kind and again.drafter.options == typed


def test_a_checkpoint_saves_the_options_it_was_built_with(tmp_path):
    from tests.export.conftest import make_checkpoint

    path = make_checkpoint(tmp_path, "eagle3", {"ttt_steps": 2, "draft_vocab_size": 64})
    meta = json.loads((path / "drafter.json").read_text())
    loaded = checkpoint.load_drafter(path, device="cpu")
    assert meta["options"] == config.to_dict(loaded.config)["drafter"]["options"]
    assert meta["options"] == config.options_mapping(loaded.drafter.cfg)
    assert loaded.drafter.cfg is loaded.config.drafter.options  # the drafter is built from the recipe's Config
    assert loaded.drafter.cfg.ttt_steps == 2 and loaded.drafter.cfg.draft_vocab_size == 64


def test_the_default_kind_is_the_one_heads_names(monkeypatch):
    assert heads.DEFAULT_KIND in DRAFTERS
    assert config.from_dict({}).drafter.kind == heads.DEFAULT_KIND
    other = next(k for k in DRAFTERS.names() if k != heads.DEFAULT_KIND)
    monkeypatch.setattr(heads, "DEFAULT_KIND", other)
    assert config.from_dict({}).drafter.kind == other


def test_one_kind_runs_any_causal_lm_as_the_draft_model():
    from draftsmith.eval.proposers import PROPOSERS

    runs_models = [k for k in DRAFTERS.names() if DRAFTERS.get(k).is_draft_model]
    assert runs_models == [heads.draft_model_kind()] and heads.draft_model_kind() in PROPOSERS
