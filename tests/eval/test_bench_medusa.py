"""benchmarks/bench_medusa.py runs end to end in its 2-step smoke mode (the benchmark itself is
not a test: CI runs only this), its --set overrides reach the drafter, and it reports a tau that
lies in the loop's range with lossless outputs."""
from __future__ import annotations

import json

from tests.conftest import STORIES, shared_path
from tests.helpers import load_repo_module


def load_bench():
    return load_repo_module("benchmarks/bench_medusa.py")


def test_bench_medusa_smoke(tmp_path, capsys):
    shared_path(STORIES)
    bench = load_bench()
    out = tmp_path / "medusa.jsonl"
    rc = bench.main(["--smoke", "--workdir", str(tmp_path), "--out", str(out), "--set", "loss=mix"])
    assert rc == 0
    assert "medusa tau@2" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["overrides"] == ["loss=mix"] and report["protocol"]["heads"] == 3
    (run,) = report["runs"]
    assert run["lossless"] and 1.0 <= run["tau"] <= 4.0
    assert run["trainable_params"] == 3 * (64 * 64 + 64 + 512 * 64)  # 3 heads x (1 block + projection)
    resolved = (tmp_path / "medusa-0" / "final").rglob("*.yaml")
    assert any("loss: mix" in p.read_text() for p in resolved)
