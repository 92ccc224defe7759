"""Markdown (GitHub-flavoured) rendering of the leaderboard: the README.md next to index.html."""
from __future__ import annotations

import os
from pathlib import Path

from draftsmith.report.leaderboard import KEY_COLUMNS, METRIC_COLUMNS, ModelTable, Row


def cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def rel(path: Path | str, out_dir: Path) -> str:
    return Path(os.path.relpath(Path(path).resolve(), out_dir.resolve())).as_posix()


def leaderboard_table(rows: list[Row], out_dir: Path) -> str:
    head = ["#"] + [name for _k, name in KEY_COLUMNS] + [name for _k, name, _f, _s in METRIC_COLUMNS]
    head += ["speed rank (per hardware)", "result", "command"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for pos, row in enumerate(rows, 1):
        vals = [str(pos)] + [f"{row.temperature:g}" if key == "temperature" else str(getattr(row, key))
                             for key, _n in KEY_COLUMNS]
        vals += [row.fmt(key) for key, _n, _f, _s in METRIC_COLUMNS]
        vals.append("—" if row.speed_rank is None else str(row.speed_rank))
        vals.append(f"[{Path(row.source).name}]({rel(row.source, out_dir)})")
        vals.append(f"`{row.command}`" if row.command else "(not recorded)")
        lines.append("| " + " | ".join(cell(v) for v in vals) + " |")
    return "\n".join(lines)


def model_table(t: ModelTable) -> str:
    lines = [f"#### {t.drafter} — {t.workload} — {cell(t.hardware)}, T={t.temperature:g}",
             "",
             f"Basis k={t.basis.k} ({Path(t.basis.source).name}, acceptance from {t.basis.model_acceptance_source}); overhead per round: {t.costs.overhead_source}. "
             f"**{t.recommendation()}**",
             "",
             "| k | E[τ] predicted | τ measured | speedup predicted | speedup measured | verify cost | note | predicted vs measured |",
             "|---|---|---|---|---|---|---|---|"]
    for p in t.predictions:
        m = t.measured.get(p.k)
        mark = "**" if p.k == t.best.k else ""
        lines.append(f"| {mark}{p.k}{mark} | {p.expected_tau:.2f} | {f'{m.acceptance_length:.2f}' if m else ''} | "
                     f"{p.speedup:.2f}× | {m.fmt('speedup') if m else ''} | {p.verify_cost_source} | "
                     f"{'extrapolated a_i' if p.extrapolated else ''} | "
                     f"{cell('⚠ DISAGREE: ' + t.flags[p.k]) if p.k in t.flags else ''} |")
    return "\n".join(lines)


def image(path: Path, out_dir: Path) -> str:
    return f"![{path.stem}]({rel(path, out_dir)})"
