"""Markdown table of bench_peers.py result files (one row per file), for docs/benchmarks.md.

    python benchmarks/peers_table.py results/ablation/*.json
    python benchmarks/peers_table.py --baseline results/ablation/baseline.json results/ablation/*.json

Each row: the file's name, its draftsmith overrides, tau mean ± std (min-max) over seeds for every
measured model and step count, and the change against --baseline when given.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def cells(report: dict) -> dict[str, dict]:
    return {key: value for key, value in report["summary"].items() if "loop" not in key}


def fmt(s: dict) -> str:
    return f"{s['mean']:.3f} ± {s['std']:.3f} ({s['min']:.2f}-{s['max']:.2f})"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--baseline", type=Path, default=None)
    args = ap.parse_args(argv)
    base = cells(json.loads(args.baseline.read_text())) if args.baseline else {}
    print("| run | draftsmith overrides | measure | τ mean ± std (min-max) | Δ vs baseline |")
    print("|---|---|---|---|---|")
    for path in args.files:
        report = json.loads(path.read_text())
        overrides = " ".join(report["protocol"].get("overrides", [])) or "(defaults)"
        for key, s in cells(report).items():
            delta = f"{s['mean'] - base[key]['mean']:+.3f}" if key in base else ""
            print(f"| {path.stem} | `{overrides}` | {key} | {fmt(s)} | {delta} |")


if __name__ == "__main__":
    main()
