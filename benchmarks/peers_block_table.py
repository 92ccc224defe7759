"""Markdown rows from bench_peers_block.py result files (docs/benchmarks.md, the block drafters' side by side
and ablation tables): per file, kind and trainer, tau mean ± std (min-max) over seeds, the real loop's tau
for draftsmith, and the mean per-position acceptance of the teacher-forced walk.

    python benchmarks/peers_block_table.py benchmarks/results/block-peers/*.json
    python benchmarks/peers_block_table.py --baseline benchmarks/results/block-peers/recipe-300.json \\
        benchmarks/results/block-peers/ablation/*.json        # adds Δ against the baseline's draftsmith mean
    python benchmarks/peers_block_table.py --pool benchmarks/results/block-peers/tuned-300-*.json
        # one row per (steps, kind, settings) over every file: the seeds run one file each, pooled, with
        # draftsmith's τ over the peer's, per seed where both trainers ran it
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


def settings_of(report: dict) -> tuple:
    """What makes two result files one experiment: the draftsmith overrides and the peer's options."""
    proto = report["protocol"]
    return (tuple(sorted(proto.get("overrides", []))), proto.get("peer_anchors"), proto.get("peer_loss"))


def pooled_rows(paths: list[Path]) -> list[dict]:
    """Runs of every file grouped by (steps, kind, settings); per trainer the taus and per-position means
    over the group's seeds, and per seed that both trainers ran, draftsmith's tau over the peer's."""
    groups: dict[tuple, list[dict]] = {}
    for path in paths:
        report = json.loads(path.read_text())
        for run in report["runs"]:
            key = (run.get("steps", 300), run["kind"], settings_of(report))
            groups.setdefault(key, []).append({**run, "file": path.name})
    out = []
    for (steps, kind, settings), runs in groups.items():
        seeds = [r.get("seed") for r in runs]
        if len(set(seeds)) != len(seeds):
            raise SystemExit(f"peers_block_table: seed listed twice for {kind} at {steps} steps in {sorted({r['file'] for r in runs})}")
        row = {"steps": steps, "kind": kind, "overrides": list(settings[0]), "files": sorted({r["file"] for r in runs})}
        for trainer in ("draftsmith", "speculators"):
            have = sorted((r for r in runs if f"{trainer}_tau" in r), key=lambda r: r.get("seed"))
            if have:
                row[trainer] = {"seeds": [r.get("seed") for r in have], "taus": [r[f"{trainer}_tau"] for r in have],
                                "pos": [statistics.mean(p) for p in zip(*[r[f"{trainer}_per_position"] for r in have])]}
        both = sorted((r for r in runs if "draftsmith_tau" in r and "speculators_tau" in r), key=lambda r: r.get("seed"))
        row["ratios"] = [r["draftsmith_tau"] / r["speculators_tau"] for r in both]
        out.append(row)
    return out


def print_pooled(paths: list[Path]) -> None:
    print("| kind | steps | trainer | seeds | τ (k = 5) | per seed | acceptance per position | draftsmith / peer, per seed |")
    print("|---|---:|---|---|---|---|---|---|")
    for row in pooled_rows(paths):
        ratio = " / ".join(f"{x:.2f}x" for x in row["ratios"])
        if row["ratios"]:
            ratio = f"{statistics.mean(row['ratios']):.2f}x ({ratio})"
        for trainer in ("draftsmith", "speculators"):
            if trainer in row:
                t = row[trainer]
                print(f"| {row['kind']} | {row['steps']} | {trainer} | {','.join(map(str, t['seeds']))} | {spread(t['taus'])} "
                      f"| {' / '.join(f'{x:.3f}' for x in t['taus'])} | {' '.join(f'{p:.2f}' for p in t['pos'])} "
                      f"| {ratio if trainer == 'draftsmith' else ''} |")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", type=Path, nargs="+")
    ap.add_argument("--baseline", type=Path, default=None)
    ap.add_argument("--pool", action="store_true", help="pool the files' seeds per (steps, kind, settings)")
    args = ap.parse_args(argv)
    if args.pool:
        print_pooled(args.files)
        return 0
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
