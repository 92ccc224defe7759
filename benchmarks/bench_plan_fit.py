"""How well `draftsmith plan` predicts the end of a run from its start: for each run directory, the acc_0
curve fitted to the held-out evaluations in the first --fraction of the run's tokens (at least the first 4,
the fewest plan fits) is read at the run's last evaluation and compared with what was measured there, once per
point-weight power (report/learning_curve.WEIGHT_POWER: 0 = every evaluation alike, 2 = plan's weighting).

    python benchmarks/bench_plan_fit.py runs/levers/base runs/levers/anchors_0.25 --fraction 0.334 --powers 0 1 2
    python benchmarks/bench_plan_fit.py runs/sweep/L-all-75 --workload mt_bench   # a workload's curve (plan --workload)

Prints one row per run (errors = predicted - measured) and, per power, how many land within --within.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.report import learning_curve as lc  # noqa: E402


def predicted_end(points: list, fraction: float, power: int) -> tuple[float, int]:
    """acc_0 at the last point from the fit of the first `fraction` of its tokens; (prediction, points fitted)."""
    end = points[-1]
    first = [p for p in points if p.tokens <= fraction * end.tokens + 1]
    if len(first) < lc.MIN_POINTS:
        first = points[:lc.MIN_POINTS]
    curve = lc.fit([p.tokens for p in first], [p.acc[0] for p in first], bootstrap=0, power=power)
    return curve.at(end.tokens), len(first)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories holding metrics.jsonl")
    ap.add_argument("--fraction", type=float, default=1 / 3)
    ap.add_argument("--powers", type=int, nargs="+", default=[0, 2])
    ap.add_argument("--within", type=float, default=0.03)
    ap.add_argument("--workload", default=None, help="a train.workload_eval workload's curve instead of the held-out "
                                                     "rows' (plan --workload)")
    args = ap.parse_args()
    hits = {p: 0 for p in args.powers}
    print("| run | evaluations fitted (tokens) | measured acc_0 at the end (tokens) | "
          + " | ".join(f"error, power {p}" for p in args.powers) + " |")
    print("|---|---|---|" + "---|" * len(args.powers))
    for run in args.runs:
        points, _ = lc.read_points(run, args.workload)
        if len(points) <= lc.MIN_POINTS:
            print(f"{run}: {len(points)} evaluations, too few to check", file=sys.stderr)
            continue
        end = points[-1]
        cells = []
        for power in args.powers:
            value, n = predicted_end(points, args.fraction, power)
            err = value - end.acc[0]
            hits[power] += abs(err) <= args.within + 1e-9
            cells.append(f"{err:+.3f}")
        print(f"| {run} | {n} (to {points[n - 1].tokens / 1e6:.3f}M) | {end.acc[0]:.3f} ({end.tokens / 1e6:.3f}M) | "
              + " | ".join(cells) + " |")
    print(" ".join(f"power {p}: {hits[p]} of {len(args.runs)} within {args.within}" for p in args.powers))
    return 0


if __name__ == "__main__":
    sys.exit(main())
