"""benchmarks/bench_plan_fit.py: per run, the acc_0 fit of the first third read at the run's last evaluation,
per point-weight power, and the count within the tolerance."""
from __future__ import annotations

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
