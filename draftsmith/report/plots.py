"""Leaderboard and report pictures (matplotlib, PNG; no pyplot global state).

Every function draws one figure to `path` and returns it. Figures with several workloads get
one panel per workload. Speed pictures are drawn per hardware (never mixing machines).
"""
from __future__ import annotations

import json
import math
import warnings
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from draftsmith.core.errors import UserError
from draftsmith.report.leaderboard import ModelTable, Row
from draftsmith.report.text_safe import plain_text

DPI = 100


def drafter_label(row: Row, with_hardware: bool = False) -> str:
    label = f"{row.drafter} k={row.k} T={row.temperature:g}"
    return f"{label} [{row.hardware}]" if with_hardware else label


def _colors(labels: list[str]) -> dict[str, tuple]:
    from matplotlib import colormaps

    cmap = colormaps["tab10"]
    return {label: cmap(i % 10) for i, label in enumerate(sorted(set(labels)))}


def _panels(n: int, width: float = 5.0, height: float = 3.6) -> tuple[Figure, list]:
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), dpi=DPI, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel().tolist()
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def _save(fig: Figure, path: Path) -> Path:
    from matplotlib.text import Text

    for text in fig.findobj(Text):  # received names: no control character reaches the picture, nor (through
        text.set_text(plain_text(text.get_text()))  # matplotlib's missing-glyph warning) the terminal
    path.parent.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings(record=True) as caught:  # tick labels are made while drawing: a received name's
        warnings.simplefilter("always")  # ESC would reach stderr inside matplotlib's missing-glyph warning
        fig.savefig(path, format="png")
    for w in caught:
        warnings.warn(plain_text(str(w.message)), w.category, stacklevel=2)
    return path


def _by_workload(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in sorted(rows, key=lambda r: r.workload):
        out.setdefault(row.workload, []).append(row)
    return out


def acceptance_by_position(rows: list[Row], path: Path, title: str) -> Path:
    """Per-position acceptance P(i accepted | < i accepted): one line per drafter, a panel per workload."""
    multi_hw = len({r.hardware for r in rows}) > 1
    labels = [drafter_label(r, multi_hw) for r in rows]
    colors = _colors(labels)
    groups = _by_workload(rows)
    fig, axes = _panels(len(groups))
    for ax, (workload, group) in zip(axes, groups.items()):
        for row in group:
            label = drafter_label(row, multi_hw)
            xs = list(range(1, len(row.per_position) + 1))
            ax.plot(xs, row.per_position, marker="o", color=colors[label], label=label)
        ax.set(title=workload, xlabel="draft position i", ylabel="P(accept i | accepted < i)", ylim=(0, 1.02))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def speedup_per_workload(rows: list[Row], path: Path, title: str) -> Path:
    """Grouped bars: median speedup per workload, one bar per drafter, whiskers p10..p90.
    Callers pass rows of ONE hardware (speed is never compared across machines)."""
    rows = [r for r in rows if r.speedup is not None]
    workloads = sorted({r.workload for r in rows})
    labels = sorted({drafter_label(r) for r in rows})
    colors = _colors(labels)
    fig = Figure(figsize=(max(8.0, 1.2 * len(workloads) * max(1, len(labels)) / 2 + 3), 4.2), dpi=DPI,
                 layout="constrained")
    ax = fig.subplots()
    width = 0.8 / max(1, len(labels))
    shown: set[str] = set()
    for j, label in enumerate(labels):
        for i, workload in enumerate(workloads):
            r = next((r for r in rows if r.workload == workload and drafter_label(r) == label), None)
            if r is None:
                continue
            err = None
            if r.speedup_p10 is not None and r.speedup_p90 is not None:
                err = [[max(0.0, r.speedup - r.speedup_p10)], [max(0.0, r.speedup_p90 - r.speedup)]]
            ax.bar(i - 0.4 + width * (j + 0.5), r.speedup, width, yerr=err, capsize=3, color=colors[label],
                   label=None if label in shown else label)
            shown.add(label)
    ax.axhline(1.0, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(workloads)), workloads)
    ax.set(ylabel="speedup (median, p10–p90)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return _save(fig, path)


def acceptance_length_vs_k(rows: list[Row], tables: list[ModelTable], path: Path, title: str) -> Path:
    """Measured acceptance length (markers) and the model's E[tau] (dashed) against k, a panel per workload."""
    groups = _by_workload(rows)
    colors = _colors([f"{r.drafter} T={r.temperature:g}" for r in rows])
    fig, axes = _panels(len(groups))
    for ax, (workload, group) in zip(axes, groups.items()):
        for drafter, temp in sorted({(r.drafter, r.temperature) for r in group}):
            name = f"{drafter} T={temp:g}"
            pts = sorted((r.k, r.acceptance_length) for r in group if (r.drafter, r.temperature) == (drafter, temp))
            ax.plot(*zip(*pts), marker="o", ls="-", color=colors[name], label=f"{name} measured")
            t = next((t for t in tables if (t.drafter, t.workload, t.temperature) == (drafter, workload, temp)), None)
            if t is not None:
                preds = [p for p in t.predictions if p.k > 0]
                ax.plot([p.k for p in preds], [p.expected_tau for p in preds], ls="--", color=colors[name],
                        alpha=0.7, label=f"{name} model E[τ] (from k={t.basis.k})")
        ax.set(title=workload, xlabel="k (draft length)", ylabel="acceptance length τ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def predicted_vs_measured(tables: list[ModelTable], path: Path, title: str) -> Path:
    """Predicted speedup against k (line; hollow markers where extrapolated) next to measured speedup
    (filled squares); a star marks the recommended k. Callers pass tables of ONE hardware."""
    by_wl: dict[str, list[ModelTable]] = {}
    for t in sorted(tables, key=lambda t: t.workload):
        by_wl.setdefault(t.workload, []).append(t)
    colors = _colors([t.drafter for t in tables])
    fig, axes = _panels(len(by_wl))
    for ax, (workload, group) in zip(axes, by_wl.items()):
        for t in group:
            c = colors[t.drafter]
            ks = [p.k for p in t.predictions]
            ax.plot(ks, [p.speedup for p in t.predictions], ls="--", color=c, label=f"{t.drafter} predicted")
            ext = [p for p in t.predictions if p.extrapolated]
            ax.scatter([p.k for p in ext], [p.speedup for p in ext], facecolors="none", edgecolors=c, s=25)
            meas = [(k, r.speedup) for k, r in sorted(t.measured.items()) if r.speedup is not None]
            if meas:
                ax.scatter(*zip(*meas), marker="s", color=c, s=40, label=f"{t.drafter} measured", zorder=3)
            ax.scatter([t.best.k], [t.best.speedup], marker="*", s=160, color=c, edgecolors="black", zorder=4)
        ax.axhline(1.0, color="black", lw=0.8, ls=":")
        ax.set(title=workload, xlabel="k", ylabel="speedup")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


MAX_TRAINING_LOG_BYTES = 64 * 1024 * 1024  # a metrics.jsonl of ~200k logged steps


def read_training_log(path: Path) -> list[dict]:
    """metrics.jsonl of the training loop: one JSON object per logged step ("step", "loss", "acc_0"..)."""
    import stat

    from draftsmith.core.files import file_kind

    mode, size = Path(path).stat().st_mode, Path(path).stat().st_size
    if not stat.S_ISREG(mode):  # a FIFO would block the read, /dev/zero would fill it
        raise UserError(f"{path}: is {file_kind(mode)}, not a regular file; a training log is a metrics.jsonl file")
    if size > MAX_TRAINING_LOG_BYTES:  # bounded: a result may name any file (a sparse 50 GB one, say)
        raise UserError(f"{path}: {size:,} bytes is more than a training log may hold "
                         f"({MAX_TRAINING_LOG_BYTES:,}); plot a shorter metrics.jsonl")
    with open(path, "rb") as f:
        data = f.read(MAX_TRAINING_LOG_BYTES + 1)  # the file may grow after stat
    if len(data) > MAX_TRAINING_LOG_BYTES:
        raise UserError(f"{path}: more than {MAX_TRAINING_LOG_BYTES:,} bytes; plot a shorter metrics.jsonl")
    records = []
    for n, line in enumerate(data.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            raise UserError(f"{path}:{n}: not a JSON object ({' '.join(str(err).split())[:80]})") from None
        if not isinstance(rec, dict) or "step" not in rec:
            raise UserError(f"{path}:{n}: each line needs a JSON object with a 'step' key")
        records.append(rec)
    if not records:
        raise UserError(f"{path}: no logged steps")
    return records


def training_curve(log_path: Path, path: Path, title: str) -> Path:
    """Loss and per-position accuracy (acc_0..acc_{n-1}) against step from a metrics.jsonl."""
    recs = read_training_log(log_path)
    fig = Figure(figsize=(10, 3.6), dpi=DPI, layout="constrained")
    ax_loss, ax_acc = fig.subplots(1, 2)
    pts = [(r["step"], r["loss"]) for r in recs if isinstance(r.get("loss"), (int, float))]
    if pts:
        ax_loss.plot(*zip(*pts), color="tab:red")
    ax_loss.set(title="loss", xlabel="step", ylabel="loss")
    acc_keys = sorted({k for r in recs for k in r if k.startswith("acc_")}, key=lambda k: int(k.split("_")[1]))
    for key in acc_keys:
        pts = [(r["step"], r[key]) for r in recs if isinstance(r.get(key), (int, float))]
        ax_acc.plot(*zip(*pts), label=f"position {int(key.split('_')[1]) + 1}")
    ax_acc.set(title="per-position accuracy", xlabel="step", ylabel="accuracy", ylim=(0, 1.02))
    if acc_keys:
        ax_acc.legend(fontsize=7)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
    fig.suptitle(title)
    return _save(fig, path)


def learning_curve(plan, later: list, path: Path, title: str, until: float | None = None) -> Path:
    """`draftsmith plan --plot`: plan.series acc_i (held-out or a workload) against training tokens (log axis), each fitted
    curve with its 10-90 % bootstrap band out to `until` tokens (default 2x the last fitted point), and
    the evaluations the fit did not see (`--upto-tokens`) as open markers."""
    now = plan.points[-1].tokens
    until = max(until or 2 * now, now, *(p.tokens for p in later))
    first = max(min(p.tokens for p in plan.points), 1.0)
    xs = [first * (until / first) ** (j / 60) for j in range(61)]
    fig = Figure(figsize=(6.4, 4.2), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    colors = _colors([f"acc_{i}" for i in range(len(plan.curves))])
    for i, curve in enumerate(plan.curves):
        color = colors[f"acc_{i}"]
        ax.plot([p.tokens for p in plan.points], [p.acc[i] for p in plan.points], "o", color=color, ms=4,
                label=f"acc_{i} {plan.series}")
        ax.plot(xs, [curve.at(x) for x in xs], "-", color=color, lw=1.2)
        band = [curve.interval(x) for x in xs]
        ax.fill_between(xs, [b[0] for b in band], [b[1] for b in band], color=color, alpha=0.15, lw=0)
        seen = [p for p in later if i < len(p.acc)]
        if seen:
            ax.plot([p.tokens for p in seen], [p.acc[i] for p in seen], "o", mfc="none", color=color, ms=5,
                    label=f"acc_{i} not fitted")
    ax.axvline(now, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set(title=title, xlabel="training tokens seen", ylabel=f"{plan.series} accuracy", ylim=(0, 1.0))
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, ncol=2)
    return _save(fig, path)


def curves_side_by_side(series: dict[str, list[tuple[float, tuple[float, ...]]]], path: Path, title: str) -> Path:
    """Held-out acc_i against training tokens for several trainers or runs on the same rows, one panel per
    draft position (benchmarks/plot_peer_curves.py: draftsmith against speculators).
    series: label -> [(tokens seen, (acc_0, acc_1, ...)), ...]."""
    series = {label: sorted(points) for label, points in series.items() if points}
    if not series:
        raise UserError(f"{path}: no curve to draw")
    positions = min(len(accs) for points in series.values() for _, accs in points)
    if positions < 1:
        raise UserError(f"{path}: the curves hold no held-out accuracy")
    fig, axes = _panels(positions, width=4.6, height=3.6)
    colors = _colors(list(series))
    for i, ax in enumerate(axes):
        for label, points in series.items():
            ax.plot([t / 1e6 for t, _ in points], [a[i] for _, a in points], "o-", ms=3, lw=1.2,
                    color=colors[label], label=label)
        ax.set(title=f"acc_{i}", xlabel="training tokens seen (M)", ylabel="held-out accuracy")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def acceptance_vs_context(rows: list[Row], path: Path, title: str) -> Path | None:
    """tau per context bin (eval/bins.py: prompt + output position at the round's start), one line per
    drafter, a panel per workload; None when no row has more than one context bin."""
    rows = [r for r in rows if len(r.aggregate.get("by_context") or []) > 1]
    if not rows:
        return None
    labels = [drafter_label(r) for r in rows]
    colors = _colors(labels)
    groups = _by_workload(rows)
    fig, axes = _panels(len(groups))
    for ax, (workload, group) in zip(axes, groups.items()):
        for row in group:
            bins = row.aggregate["by_context"]
            xs = [(b["lo"] * b["hi"]) ** 0.5 if b["lo"] else b["hi"] / 2 for b in bins]
            ax.plot(xs, [b["acceptance_length"] for b in bins], marker="o", color=colors[drafter_label(row)],
                    label=drafter_label(row))
        ax.set_xscale("log", base=2)
        ax.set(title=workload, xlabel="context tokens (bin centre)", ylabel="acceptance length τ")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)


def speedup_profile(profile: dict, path: Path, title: str) -> Path:
    """A speedup_profile.json (eval/profile.py): predicted speedup against batch size for each k at the
    workload's mean context (a panel per workload), the measured validation runs as black crosses."""
    recs = profile["recommendation"]
    fig, axes = _panels(len(recs))
    for ax, (workload, rec) in zip(axes, recs.items()):
        ctxs = sorted({p["context"] for p in profile["predicted"] if p["workload"] == workload})
        ctx = min(ctxs, key=lambda c: abs(c - rec["context"]))
        pts = [p for p in profile["predicted"] if p["workload"] == workload and p["context"] == ctx]
        for k in sorted({p["k"] for p in pts}):
            line = sorted((p["batch"], p["speedup"]) for p in pts if p["k"] == k)
            ax.plot(*zip(*line), marker=".", label=f"k={k} (predicted)")
        checks = [c for c in profile.get("validation") or [] if c["workload"] == workload]
        if checks:
            ax.plot([c["batch"] for c in checks], [c["measured"] for c in checks], "kx", markersize=9,
                    label=f"measured (k={checks[0]['k']})")
        ax.set_xscale("log", base=2)
        batches = sorted({p["batch"] for p in pts})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.set(title=f"{workload} (context {ctx})", xlabel="batch size", ylabel="speedup (decode)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    return _save(fig, path)
