"""The leaderboard as files: build_leaderboard(results, out_dir) reads many result files and writes index.html
(static, sortable, works offline), README.md (the same tables and pictures in Markdown), rows.json and plots/*.png
into out_dir, built beside it and moved into place. Malformed result files are named and skipped; files that mix
definitions or schema versions are refused. `draftsmith leaderboard` (commands/leaderboard.py) is its command.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.core.files import (
    check_output_file,
    clean_stale_temps,
    read_received_text,
    terminate_cleanly,
    write_dir_atomically,
)
from draftsmith.report import html as H
from draftsmith.report import markdown as M
from draftsmith.report import plots
from draftsmith.report.leaderboard import ModelTable, Row, build_rows, group_by_target, group_rows, model_tables
from draftsmith.report.results_io import Result, load_results
from draftsmith.report.text_safe import plain_text


@dataclass
class TargetSection:
    target: str
    rows: list[Row]
    plots: list[Path] = field(default_factory=list)
    by_hardware: dict[str, tuple[list[Path], list[ModelTable]]] = field(default_factory=dict)


@dataclass
class LeaderboardOutput:
    out_dir: Path
    index_html: Path
    readme: Path
    rows_json: Path
    rows: list[Row]
    sections: list[TargetSection]
    training_plots: list[Path]
    skipped: list[str]
    notes: list[str]
    profile_plots: list[Path] = field(default_factory=list)  # one per --profile speedup_profile.json


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower()[:60] or "x"


def resolve_training_log(result: Result) -> tuple[Path | None, str | None]:
    """The result's training_log, read only from BESIDE the result (a received result must not make
    draftsmith read any file it names): a relative path below the result's directory, or the file
    name of any other path looked up in that directory. Returns (path, None) or (None, note)."""
    raw = Path(result.training_log)
    home = result.path.parent.resolve()
    candidate = home / (raw.name if raw.is_absolute() or ".." in raw.parts else raw)
    try:
        inside = candidate.resolve().is_relative_to(home)  # symlinks resolved: no way out of the directory
    except (OSError, RuntimeError):
        inside = False
    if inside and candidate.is_file():
        return candidate, None
    why = "it leads out of the result's directory" if not inside else "not found there"
    return None, (f"{result.path}: training_log {result.training_log!r} is read only from beside the result "
                  f"({candidate}: {why}); pass --training-log PATH to plot it")


def training_plots(results: list[Result], extra_logs: list[str], plot_dir: Path) -> tuple[list[Path], list[str]]:
    """Training-curve figures for every result's training_log and every --training-log."""
    logs: list[tuple[str, Path]] = []
    notes: list[str] = []
    for r in results:
        if r.training_log:
            path, note = resolve_training_log(r)
            if path is None:
                notes.append(note)
            else:
                logs.append((f"{r.drafter_name} ({r.target_name})", path))
    logs += [(Path(p).parent.name or str(p), Path(p)) for p in extra_logs]
    out, seen = [], set()
    for label, path in logs:
        if path.resolve() in seen:
            continue
        seen.add(path.resolve())
        try:
            out.append(plots.training_curve(path, plot_dir / f"training-{len(out) + 1}-{slug(label)}.png",
                                            f"training curve: {label} — {path}"))
        except (OSError, ValueError) as err:
            notes.append(f"training log {path}: {err}")
    return out, notes


def build_sections(rows: list[Row], tables: list[ModelTable], plot_dir: Path) -> list[TargetSection]:
    """Per target: acceptance pictures over all rows; per hardware: speedup pictures and model tables."""
    sections = []
    for target, trows in group_by_target(rows).items():
        s = TargetSection(target, trows)
        ttables = [t for t in tables if t.target == target]
        base = slug(target)
        s.plots.append(plots.acceptance_by_position(trows, plot_dir / f"{base}-acceptance-by-position.png",
                                                    f"{target}: acceptance by draft position"))
        s.plots.append(plots.acceptance_length_vs_k(trows, ttables, plot_dir / f"{base}-acceptance-vs-k.png",
                                                    f"{target}: acceptance length vs k"))
        ctx = plots.acceptance_vs_context(trows, plot_dir / f"{base}-acceptance-vs-context.png",
                                          f"{target}: acceptance length vs context")
        if ctx is not None:
            s.plots.append(ctx)
        for hw in sorted({r.hardware for r in trows}):
            hrows = [r for r in trows if r.hardware == hw]
            htables = [t for t in ttables if t.hardware == hw]
            pics = []
            if any(r.speedup is not None for r in hrows):
                pics.append(plots.speedup_per_workload(hrows, plot_dir / f"{base}-{slug(hw)}-speedup.png",
                                                       f"{target}: speedup per workload — {hw}"))
            if htables:
                pics.append(plots.predicted_vs_measured(htables, plot_dir / f"{base}-{slug(hw)}-model.png",
                                                        f"{target}: predicted vs measured speedup — {hw}"))
            s.by_hardware[hw] = (pics, htables)
        sections.append(s)
    return sections


def render_html(out: LeaderboardOutput, results: list[Result]) -> str:
    src = H.relative_src(out.out_dir)
    r0 = results[0]
    parts = [f"<p class=\"meta\">{len(results)} result files, {len(out.rows)} rows; definitions "
             f"<code>{H.e(r0.definitions)}</code>, schema_version {r0.schema_version}. Runs are ranked only "
             "within a group: the same target, workload, k (or tree budget), temperature and sampling, verification "
             "rule, max_new_tokens and prompt set (the heading of each table). Within a group rows are ordered by "
             "acceptance length τ (pooled: Σ committed / Σ rounds, desc), then acceptance rate (desc). Speed is "
             "ranked only within one hardware; click a header to sort (speed columns sort within hardware).</p>",
             H.notes_box(out.skipped, "Skipped malformed result files"), H.notes_box(out.notes, "Notes")]
    for i, s in enumerate(out.sections):
        parts.append(f"<h2 id=\"target-{slug(s.target)}\">Target: {H.e(s.target)}</h2>")
        for j, grows in enumerate(group_rows(s.rows).values()):
            parts.append(f"<h3 class=\"group\">Group: {H.e(grows[0].group)}</h3>")
            parts.append(H.leaderboard_table(grows, src, f"lb-{i}-{j}"))
        parts.append(H.images(s.plots, src))
        for hw, (pics, tables) in s.by_hardware.items():
            if not pics and not tables:
                continue
            parts.append(f"<h3>Speed on {H.e(hw)}</h3>" + H.images(pics, src))
            if tables:
                parts.append(f"<p class=\"meta\">{H.e(H.MODEL_ASSUMPTIONS)}</p>")
                parts.extend(H.model_table_html(t) for t in tables)
    if out.training_plots:
        parts.append("<h2>Training curves</h2>" + H.images(out.training_plots, src))
    if out.profile_plots:
        parts.append("<h2>Speedup profiles</h2>" + H.images(out.profile_plots, src))
    return H.page("draftsmith acceptance leaderboard", "\n".join(p for p in parts if p))


def render_markdown(out: LeaderboardOutput, results: list[Result]) -> str:
    r0 = results[0]
    parts = ["# draftsmith acceptance leaderboard", "",
             f"{len(results)} result files, {len(out.rows)} rows; definitions `{r0.definitions}`, schema_version "
             f"{r0.schema_version}. Runs are ranked only within a group: the same target, workload, k (or tree "
             "budget), temperature and sampling, verification rule, max_new_tokens and prompt set. Within a group: "
             "acceptance length τ (pooled: Σ committed / Σ rounds) desc, then acceptance rate desc. "
             "Speed is ranked only within one hardware. Interactive version: [index.html](index.html).", ""]
    for heading, items in (("Skipped malformed result files", out.skipped), ("Notes", out.notes)):
        if items:
            parts += [f"**{heading}:**", ""] + [f"- {M.cell(n)}" for n in items] + [""]
    for s in out.sections:
        parts += [f"## Target: {s.target}", ""]
        for grows in group_rows(s.rows).values():
            parts += [f"### Group: {M.cell(grows[0].group)}", "", M.leaderboard_table(grows, out.out_dir), ""]
        parts += [M.image(p, out.out_dir) for p in s.plots] + [""]
        for hw, (pics, tables) in s.by_hardware.items():
            if not pics and not tables:
                continue
            parts += [f"### Speed on {hw}", ""] + [M.image(p, out.out_dir) for p in pics] + [""]
            if tables:
                parts += [H.MODEL_ASSUMPTIONS, ""]
                for t in tables:
                    parts += [M.model_table(t), ""]
    if out.training_plots:
        parts += ["## Training curves", ""] + [M.image(p, out.out_dir) for p in out.training_plots] + [""]
    if out.profile_plots:
        parts += ["## Speedup profiles", ""] + [M.image(p, out.out_dir) for p in out.profile_plots] + [""]
    return "\n".join(parts)


def build_leaderboard(paths: list[str | Path], out_dir: str | Path, training_logs: list[str] = (),
                      k_max: int = 8, profiles: list[str] = ()) -> LeaderboardOutput:
    """Load, merge, order, draw and write the leaderboard. Raises IncompatibleResultsError on mixed
    definitions/schema versions and ValueError when no file was readable.

    Everything is built in a temporary directory beside out_dir and moved into place at the end
    (index.html last), so an interrupted build leaves out_dir as it was, never plots without a page."""
    results, skipped = load_results(list(paths))
    if not results:
        raise UserError("no readable result files; skipped: " + "; ".join(skipped))  # one line (cli contract)
    final_dir = Path(out_dir)
    _check_out_dir(final_dir)
    built = {}

    def fill(work: Path) -> None:
        built["work"], built["out"] = work, _build_into(work, results, skipped, training_logs, k_max, profiles)

    clean_stale_temps(final_dir)  # .OUT.tmp-PID-* of earlier builds that were killed (their PID is gone)
    with terminate_cleanly():  # SIGTERM runs the clean-up instead of leaving .OUT.tmp-* behind
        write_dir_atomically(final_dir, fill, "leaderboard", into_existing=_move_into_place)
    return _relocated(built["out"], built["work"], final_dir)


def _check_out_dir(final_dir: Path) -> None:
    """--out is a directory (or missing) whose index.html, README.md and rows.json are regular files or missing."""
    if final_dir.exists() and not final_dir.is_dir():
        raise UserError(f"--out {final_dir}: exists and is not a directory; name a directory for the leaderboard")
    for name in ("rows.json", "README.md", "index.html"):
        check_output_file(final_dir / name, "--out")


def _move_into_place(work: Path, final_dir: Path) -> None:
    """work/* -> an existing final_dir/*: plots/ first, then the files, index.html last (other files the user keeps
    in final_dir stay; a new final_dir is one rename, done by core/files.write_dir_atomically)."""
    if not final_dir.is_dir():
        raise NotADirectoryError(f"--out {final_dir}: exists and is not a directory")
    new_plots, plots = work / "plots", final_dir / "plots"
    if plots.exists():
        old = final_dir / f".plots.old-{os.getpid()}"
        os.replace(plots, old)
        os.replace(new_plots, plots)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(new_plots, plots)
    for name in ("rows.json", "README.md", "index.html"):
        check_output_file(final_dir / name, "--out")  # a FIFO or device node there is refused, never replaced
        os.replace(work / name, final_dir / name)


def _relocated(out: LeaderboardOutput, work: Path, final_dir: Path) -> LeaderboardOutput:
    """The same output with its paths under final_dir instead of the build directory."""
    def move(p: Path) -> Path:
        return final_dir / Path(p).relative_to(work)

    for section in out.sections:
        section.plots = [move(p) for p in section.plots]
        section.by_hardware = {hw: ([move(p) for p in pics], tables) for hw, (pics, tables) in section.by_hardware.items()}
    out.training_plots = [move(p) for p in out.training_plots]
    out.profile_plots = [move(p) for p in out.profile_plots]
    out.out_dir, out.index_html, out.readme, out.rows_json = (final_dir, final_dir / "index.html",
                                                              final_dir / "README.md", final_dir / "rows.json")
    return out


def _build_into(out_dir: Path, results: list[Result], skipped: list[str], training_logs, k_max: int,
                profiles) -> LeaderboardOutput:
    plot_dir = out_dir / "plots"
    plot_dir.mkdir(parents=True, exist_ok=True)
    rows = build_rows(results)
    tables, notes = model_tables(rows, k_max)
    notes += [f"{r.source} [{r.workload}]: τ is the {r.tau_source} (the file has no acceptance_length.pooled)"
              for r in rows if r.tau_source != "pooled"]
    notes += [f"{t.drafter} on {t.workload} ({t.hardware}): {t.flags[k]} — prediction outside the measured spread"
              for t in tables for k in sorted(t.flags)]
    sections = build_sections(rows, tables, plot_dir)
    train_pics, train_notes = training_plots(results, list(training_logs), plot_dir)
    out = LeaderboardOutput(out_dir, out_dir / "index.html", out_dir / "README.md", out_dir / "rows.json", rows,
                            sections, train_pics, skipped, notes + train_notes)
    for i, path in enumerate(profiles):
        prof = _read_profile(path)
        try:
            label = f"{Path(prof['drafter']['path']).parent.name} on {prof['target']['name']}: speedup profile"
            out.profile_plots.append(plots.speedup_profile(prof, plot_dir / f"profile-{i + 1}-{slug(label)}.png", label))
        except (KeyError, TypeError, IndexError, AttributeError) as err:
            raise UserError(f"--profile {path}: not a complete speedup_profile.json ({type(err).__name__} "
                             f"{' '.join(str(err).split())[:80]}); write it again with `draftsmith profile RUN`") from None
    out.index_html.write_text(render_html(out, results), encoding="utf-8")
    out.readme.write_text(plain_text(render_markdown(out, results)), encoding="utf-8")
    out.rows_json.write_text(json.dumps([r.to_json() for r in rows], indent=1), encoding="utf-8")
    return out


def _read_profile(path: str) -> dict:
    try:
        prof = json.loads(read_received_text(path, "speedup_profile.json"))  # a regular file, bounded in size
    except (OSError, json.JSONDecodeError, RecursionError) as err:
        raise UserError(f"--profile {path}: not a readable speedup_profile.json "
                         f"({' '.join(str(err).split())[:120] or 'nested too deeply'})") from None
    if not isinstance(prof, dict):
        raise UserError(f"--profile {path}: a JSON {type(prof).__name__}, not a speedup_profile.json object "
                         "(write one with `draftsmith profile RUN`)")
    if prof.get("schema") != "draftsmith.speedup-profile":
        raise UserError(f"--profile {path}: schema {str(prof.get('schema'))[:60]!r} is not draftsmith.speedup-profile "
                         "(write one with `draftsmith profile RUN`)")
    return prof
