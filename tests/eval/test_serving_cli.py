"""`draftsmith eval --tree ...` and `--concurrency-sweep`: results carry the verify budget and the
batched rows, outputs checked lossless."""
from __future__ import annotations

import json

from draftsmith.cli import main as cli_main

try:
    from tests.conftest import STORIES, shared_path
except ImportError:  # pytest run from inside tests/
    from conftest import STORIES, shared_path


def test_tree_and_batched_eval_end_to_end(tmp_path, capsys):
    stories = shared_path(STORIES)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Once upon a time"}\n{"id": "b", "prompt": "Lily saw a big"}\n')
    common = ["--draft-model", str(stories), "--target", str(stories), "--workloads", f"jsonl:{prompts}",
              "--max-new-tokens", "16", "--warmup", "0", "--check-lossless"]
    out = tmp_path / "tree.json"
    assert cli_main(["eval", *common, "--tree", "dynamic", "--tree-depth", "3", "--tree-topk", "2",
                     "--verify-budget", "5", "--out", str(out)]) == 0
    cfg = json.loads(out.read_text())["config"]
    assert cfg["verify_budget"] == 5
    assert cfg["tree"] == {"kind": "dynamic", "depth": 3, "topk": 2, "budget": 5, "acceptance": None}
    out = tmp_path / "batch.json"
    assert cli_main(["eval", *common, "--k", "2", "--concurrency-sweep", "1,3", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["workloads"][f"jsonl:{prompts}"]["batched"]
    assert [r["batch_size"] for r in rows] == [1, 3] and [r["requests"] for r in rows] == [2, 3]
    assert all(r["lossless"] and r["acceptance_length"] == 3.0 for r in rows)  # the drafter is the target
    assert "B=3" in capsys.readouterr().out
