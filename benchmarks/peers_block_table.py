"""Markdown rows from bench_peers_block.py result files (docs/benchmarks.md, the block drafters' side by side
and ablation tables): per file, kind and trainer, tau mean ± std (min-max) over seeds, the real loop's tau
for draftsmith, and the mean per-position acceptance of the teacher-forced walk.

    python benchmarks/peers_block_table.py benchmarks/results/block-peers/*.json
    python benchmarks/peers_block_table.py --baseline benchmarks/results/block-peers/recipe-300.json \\
        benchmarks/results/block-peers/ablation/*.json        # adds Δ against the baseline's draftsmith mean
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.3f} (1 seed)"
    return f"{statistics.mean(values):.3f} ± {statistics.stdev(values):.3f} ({min(values):.2f}-{max(values):.2f})"


def rows_of(path: Path) -> list[dict]:
    """One entry per (steps, kind, trainer) in a result file."""
    report = json.loads(path.read_text())
    out = []
    groups = {}
    for run in report["runs"]:
        groups.setdefault((run.get("steps", 300), run["kind"]), []).append(run)
    for (steps, kind), runs in groups.items():
        for trainer in ("draftsmith", "speculators"):
            if f"{trainer}_tau" not in runs[0]:
                continue
            taus = [r[f"{trainer}_tau"] for r in runs]
            pos = [statistics.mean(p) for p in zip(*[r[f"{trainer}_per_position"] for r in runs])]
            loop = [r["draftsmith_loop_tau"] for r in runs] if trainer == "draftsmith" else None
            out.append({"file": path.name, "steps": steps, "kind": kind, "trainer": trainer, "taus": taus,
                        "mean": statistics.mean(taus), "loop": loop, "pos": pos,
                        "seeds": [r.get("seed", "?") for r in runs], "overrides": report["protocol"].get("overrides", [])})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--baseline", type=Path, default=None)
    args = ap.parse_args(argv)
    base = {}
    if args.baseline:
        base = {(r["steps"], r["kind"]): r["mean"] for r in rows_of(args.baseline) if r["trainer"] == "draftsmith"}
    print("| file | kind | steps | trainer | seeds | τ (k = 5) | loop τ | Δ vs baseline | acceptance per position |")
    print("|---|---|---:|---|---|---|---|---:|---|")
    for path in args.files:
        for r in rows_of(path):
            loop = spread(r["loop"]) if r["loop"] else "-"
            ref = base.get((r["steps"], r["kind"]))
            delta = f"{r['mean'] - ref:+.3f}" if ref is not None else "-"
            pos = " ".join(f"{p:.2f}" for p in r["pos"])
            seeds = ",".join(map(str, r["seeds"]))
            print(f"| {r['file']} | {r['kind']} | {r['steps']} | {r['trainer']} | {seeds} | {spread(r['taus'])} | {loop} "
                  f"| {delta} | {pos} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
