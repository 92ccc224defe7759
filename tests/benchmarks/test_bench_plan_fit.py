"""benchmarks/bench_plan_fit.py: per run, the acc_0 fit of the first third read at the run's last evaluation,
per point-weight power, and the count within the tolerance."""
from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO
from tests.report.test_learning_curve import synthetic_log


def test_prints_each_runs_error_per_power_and_the_count_within(tmp_path):
    exact = synthetic_log(tmp_path / "exact", noise=0.0)          # the power law itself: every power recovers it
    bent = synthetic_log(tmp_path / "bent", noise=0.0)
    lines = (bent / "metrics.jsonl").read_text().splitlines()
    lines[-1] = lines[-1].replace('"eval_acc_0": ', '"eval_acc_0": 0.2, "was": ')  # the end far below the curve
    (bent / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    out = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_plan_fit.py"), str(exact), str(bent),
                          "--powers", "0", "2"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    rows = {line.split("|")[1].strip(): line for line in out.splitlines() if line.startswith(f"| {tmp_path}")}
    exact_cells = [c.strip() for c in rows[str(exact)].split("|")[4:6]]
    assert all(abs(float(c)) <= 0.002 for c in exact_cells), exact_cells
    assert all(float(c.strip()) > 0.3 for c in rows[str(bent)].split("|")[4:6])
    assert "power 0: 1 of 2 within 0.03 power 2: 1 of 2 within 0.03" in out
    assert "5 (to 1.000M)" in rows[str(exact)]  # steps 20..100 of 320 (1e4 tokens a step): the first third


def test_a_workloads_curve_is_checked_with_workload(tmp_path):
    """--workload reads eval_<workload>/acc_i (train.workload_eval) instead of the held-out eval_acc_i."""
    run = synthetic_log(tmp_path / "run", noise=0.0)
    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    for record in lines:
        record["eval_mt_bench/acc_0"] = record["eval_acc_0"] - 0.2
    lines[-1]["eval_mt_bench/acc_0"] = 0.1  # the workload's end far below its curve; the held-out end on it
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")
    bench = [sys.executable, str(REPO / "benchmarks" / "bench_plan_fit.py"), str(run), "--powers", "2"]
    held = subprocess.run(bench, capture_output=True, text=True, check=True, cwd=REPO).stdout
    mt = subprocess.run(bench + ["--workload", "mt_bench"], capture_output=True, text=True, check=True, cwd=REPO).stdout
    assert "power 2: 1 of 1 within 0.03" in held
    assert "power 2: 0 of 1 within 0.03" in mt and "| 0.100 (3.200M) |" in mt
