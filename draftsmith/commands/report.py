"""`draftsmith report`: one result file in the terminal and as one self-contained HTML file.

    draftsmith report results/eagle3-stories260k.json                 # also writes results/eagle3-stories260k.html
    draftsmith report results/run.json --html /tmp/run.html --training-log runs/x/metrics.jsonl
    draftsmith report results/run.json --no-html

The HTML embeds its pictures as data URIs, so the one file can be mailed or opened offline.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from draftsmith.core.files import check_output_file, disk_full_guard, write_text_atomically
from draftsmith.report import html as H
from draftsmith.report import plots
from draftsmith.report.leaderboard import METRIC_COLUMNS, ModelTable, Row, build_rows, model_tables
from draftsmith.report.leaderboard_site import resolve_training_log
from draftsmith.report.results_io import MalformedResultError, Result, check_compatible, load_result
from draftsmith.report.text_safe import plain_text


def terminal_text(result: Result, rows: list[Row], tables: list[ModelTable]) -> str:
    """The plain-text summary printed by `draftsmith report`."""
    r0 = rows[0]
    lines = [f"{result.path}",
             f"  target {r0.target} | drafter {r0.drafter} ({r0.drafter_kind}) | k={r0.k} T={r0.temperature:g}",
             f"  hardware {r0.hardware} | definitions {result.definitions} schema_version {result.schema_version}",
             f"  command: {result.command or '(not recorded)'}", ""]
    width = max(len("workload"), *(len(r.workload) for r in rows))
    header = f"{'workload':<{width}}" + "".join(f"  {name:>13}" for _k, name, _f, _s in METRIC_COLUMNS)
    lines += [header, "-" * len(header)]
    for r in rows:
        lines.append(f"{r.workload:<{width}}" + "".join(f"  {r.fmt(key):>13}" for key, _n, _f, _s in METRIC_COLUMNS))
    lines += ["", "per-position acceptance P(i accepted | < i accepted):"]
    for r in rows:
        lines.append(f"  {r.workload:<{width}}  " + " ".join("—" if a != a else f"{a:.2f}" for a in r.per_position))
    engine = {w: wl["engine"] for w, wl in result.workloads.items() if isinstance(wl.get("engine"), dict)}
    if engine:  # draftsmith eval --engine: the same drafter served by a real engine
        from draftsmith.report.parity import parity_lines

        lines += ["", "train-to-serve parity (draftsmith eval --engine):"]
        lines += [line for w, e in engine.items() for line in parity_lines(w, e)]
    if tables:
        lines += ["", "speedup model (Leviathan et al. 2023; * = extrapolated acceptance, ~ = verify cost assumed):"]
        for t in tables:
            m = t.measured.get(t.basis.k)
            at_k = next(p for p in t.predictions if p.k == t.basis.k)
            preds = " ".join(f"k{p.k}={p.speedup:.2f}{'*' if p.extrapolated else ''}"
                             f"{'~' if p.verify_cost_source != 'measured' else ''}" for p in t.predictions)
            lines.append(f"  {t.workload:<{width}}  best k={t.best.k} ({t.best.speedup:.2f}x predicted); "
                         f"at k={t.basis.k}: predicted {at_k.speedup:.2f}x / measured {m.fmt('speedup')}, "
                         f"E[tau] {at_k.expected_tau:.2f} / tau {m.acceptance_length:.2f}"
                         f"{'  DISAGREE: outside the measured p10-p90' if at_k.k in t.flags else ''}")
            if t.best.k in t.flags:
                lines.append(f"  {'':<{width}}  {t.recommendation()}")
            lines.append(f"  {'':<{width}}  {preds}")
    return "\n".join(lines)


def write_html(result: Result, rows: list[Row], tables: list[ModelTable], notes: list[str], path: Path,
               training_logs: list[Path]) -> Path:
    """One self-contained HTML page (pictures inline) for one result."""
    with tempfile.TemporaryDirectory(prefix="draftsmith-report-") as tmp:
        d = Path(tmp)
        pics = [plots.acceptance_by_position(rows, d / "acceptance.png", "acceptance by draft position")]
        if any(r.speedup is not None for r in rows):
            pics.append(plots.speedup_per_workload(rows, d / "speedup.png", f"speedup per workload — {rows[0].hardware}"))
        if tables:
            pics.append(plots.acceptance_length_vs_k(rows, tables, d / "tau-vs-k.png", "acceptance length vs k"))
            pics.append(plots.predicted_vs_measured(tables, d / "model.png", "predicted vs measured speedup"))
        for i, log in enumerate(training_logs):
            try:
                pics.append(plots.training_curve(log, d / f"training-{i}.png", f"training curve — {log}"))
            except (OSError, ValueError) as err:
                notes.append(f"training log {log}: {err}")
        link = H.relative_src(path.parent)
        parts = [f"<p class=\"meta\">definitions <code>{H.e(result.definitions)}</code>, schema_version "
                 f"{result.schema_version}; command <code class=\"cmd\">{H.e(result.command)}</code></p>",
                 H.notes_box(notes, "Notes"), H.leaderboard_table(rows, link, "report"), H.images(pics, H.inline_src)]
        if tables:
            parts.append(f"<p class=\"meta\">{H.e(H.MODEL_ASSUMPTIONS)}</p>")
            parts.extend(H.model_table_html(t) for t in tables)
        page = H.page(f"draftsmith report: {result.path.name}", "\n".join(p for p in parts if p))
    with disk_full_guard(path, "HTML report"):  # a full disk: one line naming the page, the old page kept
        return write_text_atomically(path, page, "--html")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("result", help="one result JSON file written by `draftsmith eval`")
    parser.add_argument("--html", default=None, metavar="PATH", help="HTML output (default: the result path with .html)")
    parser.add_argument("--no-html", action="store_true", help="print to the terminal only")
    parser.add_argument("--training-log", action="append", default=[], metavar="PATH",
                        help="the run's metrics.jsonl (default: the result's training_log field)")
    parser.add_argument("--k-max", type=int, default=8, help="largest k the speedup model predicts (default 8)")


def main(args: argparse.Namespace) -> int:
    from draftsmith.core.bounds import check_draft_tokens

    check_draft_tokens(args.k_max, "--k-max", minimum=0)  # the speedup model predicts k = 0..k_max
    try:
        result = load_result(args.result)
        check_compatible([result])
    except (MalformedResultError, ValueError) as err:
        print(plain_text(f"draftsmith report: {err}"), file=sys.stderr)
        return 2
    rows = build_rows([result])
    tables, notes = model_tables(rows, args.k_max)
    logs = [Path(p) for p in args.training_log]
    if not logs and result.training_log:
        log, note = resolve_training_log(result)
        logs, notes = ([log], notes) if log else ([], notes + [note])
    path = Path(args.html) if args.html else result.path.with_suffix(".html")
    if not args.no_html and path.exists() and path.resolve() == result.path.resolve():
        print(plain_text(f"draftsmith report: the HTML output {path} is the result file itself; pass --html "
                         "OTHER.html (or --no-html)"), file=sys.stderr)
        return 2
    if not args.no_html:
        check_output_file(path, "--html")  # a device node, FIFO or socket: refused before anything is drawn
    print(plain_text(terminal_text(result, rows, tables)))  # a result's strings cannot drive the terminal
    if not args.no_html:
        write_html(result, rows, tables, notes, path, logs)
        print(plain_text(f"\nHTML report: {path}"))
    for note in notes:
        print(plain_text(f"note: {note}"), file=sys.stderr)
    return 0
