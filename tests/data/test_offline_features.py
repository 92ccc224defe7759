"""Offline features: a cache built by `draftsmith prepare --features` trains to the same losses
as online features, and training refuses a cache built for another target."""
from __future__ import annotations

import pytest

from draftsmith import config
from draftsmith.cli import main as cli_main
from draftsmith.train.loop import train


def test_offline_cache_trains_like_online(tiny_run, tmp_path):
    online = train(tiny_run("online", "train.max_steps=4"))
    cache = tmp_path / "cache"
    offline_args = ["features.mode=offline", f"features.cache_dir={cache}", "features.dtype=float32",
                    "train.max_steps=4"]
    cfg = tiny_run("offline", *offline_args)
    recipe = tmp_path / "offline.yaml"
    recipe.write_text(config.to_yaml(cfg))
    assert cli_main(["prepare", str(recipe), "--features"]) == 0
    offline = train(config.load(recipe))
    assert offline.losses == pytest.approx(online.losses, rel=1e-4)
    assert offline.last_metrics["acc_0"] == pytest.approx(online.last_metrics["acc_0"], abs=1e-6)


def test_cache_for_another_target_is_refused(tiny_run, tmp_path):
    cache = tmp_path / "cache"
    cfg = tiny_run("a", "features.mode=offline", f"features.cache_dir={cache}")
    recipe = tmp_path / "a.yaml"
    recipe.write_text(config.to_yaml(cfg))
    assert cli_main(["prepare", str(recipe), "--features"]) == 0
    other = tmp_path / "other-target"
    from draftsmith.testing import tiny_target

    t = tiny_target(num_layers=4, hidden=32, seed=7)
    t.model.save_pretrained(other)
    t.tokenizer.save_pretrained(other)
    with pytest.raises(ValueError, match="fingerprint.*rebuild|fingerprint"):
        train(tiny_run("b", "features.mode=offline", f"features.cache_dir={cache}", f"target.path={other}"))
