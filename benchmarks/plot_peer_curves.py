"""Draw the held-out curves of benchmarks/bench_peer_recipe.py reports side by side: acc_0, acc_1 and acc_2
against training tokens, one line per trainer and report (draftsmith against speculators on the same rows).

    python benchmarks/plot_peer_curves.py runs/peer-all-lop/peer.json --label "all 3,923 rows" \\
        --out benchmarks/results/learnfast/smollm2-draftsmith-vs-speculators.png

Each report gives its draftsmith curve (trained in the bench or read from --draftsmith-metrics) and its
speculators curve; --label names the report in the legend (one per report, in order; default: its path).
--run LABEL=RUN adds a `draftsmith train` run's own held-out evaluations (RUN/metrics.jsonl), e.g. a later
recipe measured on the same rows:

    python benchmarks/plot_peer_curves.py runs/peer-bs4lr1-750k/peer.json --label "1,648 rows" --peers speculators \
        --run "draftsmith, the recipe on 1,648 rows=runs/sweep/L-new" --out PNG
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith.core.errors import UserError  # noqa: E402
from draftsmith.core.files import check_output_file, read_json_object  # noqa: E402
from draftsmith.report import learning_curve, plots  # noqa: E402

TRAINERS = ("draftsmith", "speculators")


def curve_points(curve: list, where: str = "curve") -> list[tuple[float, tuple[float, ...]]]:
    """A bench curve ([{"tokens_seen", "eval_acc_0", ...}]) -> [(tokens, (acc_0, acc_1, ...))]; a row that is
    not an object, or a value that is not a finite number (accuracies in 0..1), is one line naming the row."""
    points = []
    for n, row in enumerate(curve):
        if not isinstance(row, dict):
            raise UserError(f"{where} row {n}: a {type(row).__name__}, not an evaluation object; the report is damaged "
                            "or not bench_peer_recipe.py's: run the bench again")
        accs, i = [], 0
        while f"eval_acc_{i}" in row:
            accs.append(row[f"eval_acc_{i}"])
            i += 1
        if not accs:
            continue
        tokens = row.get("tokens_seen")
        number = learning_curve.finite_number
        if not number(tokens) or tokens < 0 or not all(number(a) and 0 <= a <= 1 for a in accs):
            raise UserError(f"{where} row {n}: tokens_seen must be a number >= 0 and eval_acc_* numbers in 0..1, got "
                            f"tokens_seen={str(tokens)[:40]!r}, eval_acc={str(accs)[:80]}; the report is damaged: "
                            "run the bench again")
        points.append((float(tokens), tuple(float(a) for a in accs)))
    return points


def series_of(reports: list[Path], labels: list[str], trainers=TRAINERS) -> dict[str, list]:
    if labels and len(labels) != len(reports):
        raise UserError(f"--label given {len(labels)} times for {len(reports)} reports: give one per report, or none")
    series: dict[str, list] = {}
    for n, path in enumerate(reports):
        report = read_json_object(path, "bench_peer_recipe report")
        name = labels[n] if labels else str(path)
        found = 0
        for trainer in trainers:
            part = report.get(trainer)
            if isinstance(part, dict) and isinstance(part.get("curve"), list):
                _add(series, f"{trainer}, {name}", curve_points(part["curve"], f"{path}: the {trainer} curve"))
                found += 1
        if not found:
            raise UserError(f"{path}: holds no {' or '.join(trainers)} curve; give a bench_peer_recipe.py --out file "
                            "(or choose the trainers it holds with --peers)")
    return series


def _add(series: dict, label: str, points: list) -> None:
    if label in series:
        raise UserError(f"two curves are named {label!r}: give each report and --run its own label")
    series[label] = points


def run_series(specs: list[str]) -> dict[str, list]:
    """--run LABEL=RUN -> {LABEL: that run's held-out (tokens, accs)}."""
    series: dict[str, list] = {}
    for spec in specs:
        label, sep, run = spec.rpartition("=")
        if not sep or not label or not run:
            raise UserError(f"--run {spec!r}: give LABEL=RUN_DIR")
        points, _ = learning_curve.read_points(Path(run))
        _add(series, label, [(p.tokens, p.acc) for p in points])
    return series


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("reports", nargs="*", type=Path, help="bench_peer_recipe.py --out files")
    ap.add_argument("--label", action="append", default=[], help="legend name of each report, in order")
    ap.add_argument("--peers", default=",".join(TRAINERS), help="which curves of each report to draw")
    ap.add_argument("--run", action="append", default=[], metavar="LABEL=RUN",
                    help="also draw a draftsmith run's held-out evaluations (RUN/metrics.jsonl)")
    ap.add_argument("--title", default="held-out acceptance on the same rows")
    ap.add_argument("--out", type=Path, required=True, help="the PNG to write")
    args = ap.parse_args(argv)
    try:
        trainers = [t for t in args.peers.split(",") if t]
        unknown = sorted(set(trainers) - set(TRAINERS))
        if unknown:
            raise UserError(f"--peers {args.peers}: unknown {', '.join(unknown)}; choose from {', '.join(TRAINERS)}")
        if not args.reports and not args.run:
            raise UserError("nothing to draw: give bench_peer_recipe.py reports, or --run LABEL=RUN")
        out = check_output_file(args.out, "--out")
        series = series_of(args.reports, args.label, trainers)
        for label, points in run_series(args.run).items():
            _add(series, label, points)
        print(plots.curves_side_by_side(series, out, args.title))
    except UserError as e:
        print(f"plot_peer_curves: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
