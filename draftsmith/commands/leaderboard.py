"""`draftsmith leaderboard`: one acceptance leaderboard from many result files.

    draftsmith leaderboard results/*.json --out leaderboard/
    draftsmith leaderboard machine-a/results/ machine-b/results/ --out leaderboard/ --training-log runs/x/metrics.jsonl

Writes leaderboard/index.html (static, sortable, works offline), leaderboard/README.md (the
same tables and pictures in Markdown), leaderboard/rows.json and leaderboard/plots/*.png.
Malformed result files are named on stderr and skipped; files that mix definitions or schema
versions are refused (exit status 2).
"""
from __future__ import annotations

import argparse
import sys

from draftsmith.report.leaderboard_site import build_leaderboard
from draftsmith.report.results_io import IncompatibleResultsError
from draftsmith.report.text_safe import plain_text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("results", nargs="+", help="result JSON files or directories of them (any machines / runs)")
    parser.add_argument("--out", default="leaderboard", help="output directory (default: leaderboard/)")
    parser.add_argument("--training-log", action="append", default=[], metavar="PATH",
                        help="a training run's metrics.jsonl to plot (repeatable)")
    parser.add_argument("--k-max", type=int, default=8, help="largest k the speedup model predicts (default 8)")
    parser.add_argument("--profile", action="append", default=[], metavar="PATH",
                        help="a speedup_profile.json (draftsmith profile) to plot: speedup against batch size (repeatable)")


def main(args: argparse.Namespace) -> int:
    from draftsmith.core.bounds import check_draft_tokens

    check_draft_tokens(args.k_max, "--k-max", minimum=0)  # the speedup model predicts k = 0..k_max
    try:
        out = build_leaderboard(args.results, args.out, args.training_log, args.k_max, args.profile)
    except (IncompatibleResultsError, ValueError, FileNotFoundError) as err:
        print(plain_text(f"draftsmith leaderboard: {err}"), file=sys.stderr)
        return 2
    for msg in out.skipped:
        print(plain_text(f"skipped: {msg}"), file=sys.stderr)
    for msg in out.notes:
        print(plain_text(f"note: {msg}"), file=sys.stderr)
    print(f"{len(out.rows)} rows from {len({r.source for r in out.rows})} files -> {out.index_html}, {out.readme}, "
          f"{sum(len(s.plots) + sum(len(p) for p, _t in s.by_hardware.values()) for s in out.sections) + len(out.training_plots)}"
          " plots")
    return 0
