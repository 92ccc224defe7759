"""Recipe schema: overrides, unknown keys with suggestions, all errors at once, resolved config."""
from __future__ import annotations

import pytest
import yaml

from draftsmith import config


def test_overrides_apply_with_yaml_types():
    cfg = config.from_dict({"train": {"lr": 1e-3}}, overrides=["train.lr=2e-4", "train.max_steps=7",
                                                              "drafter.ttt_steps=3", "data.path=[a.jsonl, b.jsonl]"])
    assert cfg.train.lr == pytest.approx(2e-4) and cfg.train.max_steps == 7
    assert cfg.drafter.options.ttt_steps == 3
    assert cfg.data.path == ["a.jsonl", "b.jsonl"]


def test_all_problems_reported_at_once_with_suggestions():
    raw = {"trian": {}, "train": {"batch_size": "x", "precision": "bf15"}, "drafter": {"kind": "eagle3", "ttt_step": 3}}
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(raw, "r.yaml")
    text = str(err.value)
    assert "r.yaml: 4 problem(s)" in text
    assert "did you mean 'train'" in text
    assert "did you mean 'drafter.ttt_steps'" in text
    assert "train.batch_size: expected an integer" in text
    assert "did you mean 'bf16'" in text


def test_unknown_drafter_kind_is_named():
    with pytest.raises(config.ConfigError, match="unknown drafter kind 'eagle'.*did you mean .*'eagle3'"):
        config.from_dict({"drafter": {"kind": "eagle"}})


def test_semantic_checks():
    with pytest.raises(config.ConfigError, match="features.cache_dir: required"):
        config.from_dict({"features": {"mode": "offline"}})


def test_resolved_config_round_trips(tmp_path):
    cfg = config.from_dict({"drafter": {"kind": "eagle3", "ttt_steps": 4}}, overrides=["train.seed=3"])
    path = tmp_path / "resolved.yaml"
    path.write_text(config.to_yaml(cfg))
    again = config.load(path)
    assert config.to_dict(again) == config.to_dict(cfg)
    assert yaml.safe_load(path.read_text())["drafter"]["options"]["ttt_steps"] == 4


def test_missing_and_malformed_files(tmp_path):
    with pytest.raises(config.ConfigError, match="cannot read the recipe"):
        config.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("train: [unclosed\n")
    with pytest.raises(config.ConfigError, match="not valid YAML"):
        config.load(bad)


def test_train_num_workers_is_gone():
    """It was never read (issue 11, item 21): a recipe naming it gets the normal unknown-key error."""
    with pytest.raises(config.ConfigError, match=r"unknown key 'train\.num_workers'"):
        config.from_dict({"train": {"num_workers": 2}})


def test_draft_lm_lora_options_are_typed_and_validated():
    from draftsmith.heads.base import LoraOptions

    cfg = config.from_dict({"drafter": {"kind": "draft_lm", "lora": {"r": 4, "target_modules": ["q_proj"]}}})
    lora = cfg.drafter.options.lora
    assert lora == LoraOptions(r=4, alpha=32, dropout=0.0, target_modules=["q_proj"])
    assert config.from_dict({"drafter": {"kind": "draft_lm"}}).drafter.options.lora is None
    bad = {"drafter": {"kind": "draft_lm", "lora": {"rank": 4, "r": "x"}}}
    with pytest.raises(config.ConfigError) as err:
        config.from_dict(bad)
    assert sorted(err.value.problems) == ["drafter.lora.r: expected an integer, got 'x'",
                                          "unknown key 'drafter.lora.rank' (known: r, alpha, dropout, target_modules)"]
    with pytest.raises(config.ConfigError) as err:
        config.from_dict({"drafter": {"kind": "draft_lm", "lora": {"r": 0, "dropout": 1.0, "target_modules": []}}})
    assert err.value.problems == ["drafter.lora.r: must be >= 1, got 0", "drafter.lora.dropout: must be >= 0 and < 1, got 1.0",
                                  "drafter.lora.target_modules: must name at least one module, or be null (every Llama linear)"]
