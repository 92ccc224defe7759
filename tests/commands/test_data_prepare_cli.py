"""`draftsmith prepare`: regenerate a recipe's data with the target, then build its feature
cache for the recipe's drafter (layers from the drafter kind), all from the command line."""
from __future__ import annotations

import json

import yaml

from draftsmith import cli
from draftsmith.data import feature_cache
from draftsmith.targets.load import load
from draftsmith.testing import tiny_target


def test_prepare_regenerates_then_builds_the_cache(tmp_path, capsys):
    model_dir = tmp_path / "target"
    tiny = tiny_target(num_layers=2, hidden=32)
    tiny.model.save_pretrained(model_dir)
    tiny.tokenizer.save_pretrained(model_dir)
    data = tmp_path / "prompts.jsonl"
    data.write_text("\n".join(json.dumps({"prompt": f"question {i}"}) for i in range(5)) + "\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({
        "target": {"path": str(model_dir), "device": "cpu"},
        "data": {"path": [str(data)], "max_length": 64},
        "features": {"cache_dir": str(tmp_path / "cache"), "shard_rows": 2},
        "drafter": {"kind": "eagle3"},
        "regenerate": {"output": str(tmp_path / "regen.jsonl"), "max_new_tokens": 4, "batch_size": 2},
    }))
    assert cli.main(["prepare", str(recipe), "--limit", "3"]) == 0
    assert len(open(tmp_path / "regen.jsonl").readlines()) == 3
    assert cli.main(["prepare", str(recipe), "--features"]) == 0
    out = capsys.readouterr().out
    assert "input 5 = success 5 (resumed 3) + error 0 + skipped 0 [ok]" in out
    rows = [json.loads(line) for line in open(tmp_path / "regen.jsonl")]
    assert [r["id"] for r in rows] == [f"{data}:{i}" for i in range(1, 6)]
    target = load(str(model_dir), device="cpu")
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert manifest["layers"] == [0, 1, 1] and manifest["target_fingerprint"] == target.fingerprint
    cached = feature_cache.open(str(tmp_path / "cache"), target, [0, 1, 1])
    # rows whose answer came back empty are skipped by the data report; the rest are cached
    assert 1 <= len(cached) <= 5 and cached[0]["aux_hidden_states"].shape[-1] == 3 * 32
    assert cli.main(["prepare", str(recipe), "regenerate.output=null"]) == 2
