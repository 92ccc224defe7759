"""scripts/device_check.sh --dry-run: every step of the prepared GPU check runs on CPU at toy sizes,
with deepspeed / wandb / datasets made absent as on the GPU machine, and one JSON is written."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_device_check_dry_run(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--dry-run", "--out", str(tmp_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500)
    logs = {p.name: p.read_text()[-1500:] for p in tmp_path.glob("*.log")}
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}\n{logs}"
    result = json.loads((tmp_path / "device_check.json").read_text())
    assert result["dry_run"] and result["device"] == "cpu"
    assert set(result["steps"]) == {"install", "pytest_gpu", "quickstart", "train_scale", "eval_bound"}
    assert all(s["ok"] for s in result["steps"].values())
    assert {r["path"] for r in result["train_scale"]["rows"]} == {"today", "new"}
    assert all(r["peak_bytes"] > 0 and r["tokens_per_s"] > 0 for r in result["train_scale"]["rows"])
    assert result["eval_bound"] and result["eval_bound"][0]["tau"] >= 1.0
    assert result["quickstart_last"]["step"] == 2


def test_device_check_refuses_unknown_arguments():
    proc = subprocess.run(["bash", str(ROOT / "scripts" / "device_check.sh"), "--fast"], capture_output=True, text=True)
    assert proc.returncode == 2 and "unknown argument --fast" in proc.stderr
