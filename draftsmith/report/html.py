"""Static HTML for the leaderboard and the one-run report: inline CSS and JS, no CDN, works offline.

Tables are sortable by clicking a header (or with `#sort=COLUMN:asc|desc` in the URL). Sorting
by a speed column sorts within each hardware first, so machines are never ranked against each
other by speed.
"""
from __future__ import annotations

import base64
import html
from collections.abc import Callable
from pathlib import Path

from draftsmith.report.leaderboard import KEY_COLUMNS, METRIC_COLUMNS, ModelTable, Row

CSS = """
body{font-family:system-ui,-apple-system,'DejaVu Sans',sans-serif;margin:24px;color:#1b1f24;background:#fff}
h1{font-size:1.6em} h2{border-bottom:2px solid #d0d7de;padding-bottom:4px;margin-top:32px}
table{border-collapse:collapse;margin:8px 0 16px;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#f0f3f6;cursor:pointer;user-select:none;white-space:nowrap}
th.sorted-asc::after{content:' \\25B2'} th.sorted-desc::after{content:' \\25BC'}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr:nth-child(even) td{background:#f8fafc} tr.best td{background:#e6f4ea}
td{white-space:nowrap} .scroll{overflow-x:auto}
code.cmd{font-size:11px;color:#57606a;white-space:normal;word-break:break-all;display:block;max-width:40em}
details summary{cursor:pointer;color:#57606a;font-size:11px}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:8px 12px;margin:8px 0}
img{max-width:100%;border:1px solid #d0d7de;margin:6px 0}
.meta{color:#57606a;font-size:13px}
"""

JS = """
function dsSort(table, col, dir){
  const th = table.querySelector('th[data-col="'+col+'"]'); if(!th) return;
  const idx = Array.from(th.parentNode.children).indexOf(th);
  const num = th.dataset.type === 'num', speed = th.dataset.speed === '1';
  const body = table.tBodies[0], rows = Array.from(body.rows);
  const val = r => { const c = r.cells[idx]; const v = c.dataset.v;
    if(num){ return v === undefined || v === '' ? null : parseFloat(v); } return c.textContent; };
  rows.sort((a, b) => {
    if(speed && a.dataset.hardware !== b.dataset.hardware) return a.dataset.hardware < b.dataset.hardware ? -1 : 1;
    const x = val(a), y = val(b);
    if(x === null && y === null) return 0; if(x === null) return 1; if(y === null) return -1;
    const c = num ? x - y : String(x).localeCompare(String(y));
    return dir === 'asc' ? c : -c; });
  rows.forEach(r => body.appendChild(r));
  table.querySelectorAll('th').forEach(h => h.classList.remove('sorted-asc', 'sorted-desc'));
  th.classList.add('sorted-' + dir); table.dataset.sortedBy = col + ':' + dir;
}
document.querySelectorAll('table.sortable').forEach(t => t.querySelectorAll('th[data-col]').forEach(th =>
  th.addEventListener('click', () => dsSort(t, th.dataset.col,
    t.dataset.sortedBy === th.dataset.col + ':desc' ? 'asc' : 'desc'))));
const m = location.hash.match(/^#sort=([a-z0-9_]+):(asc|desc)$/);
if(m){ document.querySelectorAll('table.sortable').forEach(t => dsSort(t, m[1], m[2])); }
"""

def e(value, quote: bool = True) -> str:
    """Every value written into a page, text or attribute, goes through here; quotes are always
    escaped (`quote` is accepted for html.escape's signature and ignored)."""
    return html.escape(str(value), quote=True)


def page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
            f"<style>{CSS}</style></head>\n<body>\n<h1>{e(title)}</h1>\n{body}\n<script>{JS}</script>\n</body></html>\n")


def relative_src(out_dir: Path) -> Callable[[Path], str]:
    """Image/link source relative to the page (the leaderboard directory)."""
    def src(path: Path) -> str:
        return Path(_relpath(path, out_dir)).as_posix()  # escaped where it is written
    return src


def inline_src(path: Path) -> str:
    """Image source embedded as a data URI (the one-file report)."""
    return "data:image/png;base64," + base64.b64encode(Path(path).read_bytes()).decode("ascii")


def _relpath(path: Path, start: Path) -> str:
    import os

    return os.path.relpath(Path(path).resolve(), Path(start).resolve())


def leaderboard_table(rows: list[Row], link: Callable[[Path], str], table_id: str) -> str:
    """One sortable table; rows in the order given (see leaderboard.order_key)."""
    head = ["<th data-col=\"pos\" data-type=\"num\">#</th>"]
    head += [f"<th data-col=\"{key}\" data-type=\"{'num' if key in ('k', 'temperature') else 'str'}\">{e(name)}</th>"
             for key, name in KEY_COLUMNS]
    head += [f"<th data-col=\"{key}\" data-type=\"num\" data-speed=\"{int(speed)}\">{e(name)}</th>"
             for key, name, _fmt, speed in METRIC_COLUMNS]
    head += ["<th data-col=\"speed_rank\" data-type=\"num\" data-speed=\"1\" title=\"rank by speedup within the "
             "same group and hardware\">speed rank†</th>", "<th>result / command</th>"]
    body = []
    for pos, row in enumerate(rows, 1):
        cells = [f"<td class=\"num\" data-v=\"{e(pos)}\">{e(pos)}</td>"]
        for key, _name in KEY_COLUMNS:
            value = getattr(row, key)
            attr = f" class=\"num\" data-v=\"{e(value)}\"" if key in ("k", "temperature") else ""
            cells.append(f"<td{attr}>{e(f'{value:g}' if key == 'temperature' else str(value))}</td>")
        for key, _name, _fmt, _speed in METRIC_COLUMNS:
            value = getattr(row, key)
            cells.append(f"<td class=\"num\" data-v=\"{'' if value is None else e(repr(value))}\">{e(row.fmt(key))}</td>")
        rank = "" if row.speed_rank is None else str(row.speed_rank)
        cells.append(f"<td class=\"num\" data-v=\"{e(rank)}\">{e(rank or '—')}</td>")
        cells.append(f"<td><a href=\"{e(link(Path(row.source)))}\">{e(Path(row.source).name)}</a><details>"
                     f"<summary>command</summary><code class=\"cmd\">{e(row.command or '(not recorded)')}</code>"
                     "</details></td>")
        key_attr = e("|".join(str(x) for x in row.key))
        body.append(f"<tr data-row=\"{key_attr}\" data-hardware=\"{e(row.hardware)}\">{''.join(cells)}</tr>")
    return (f"<div class=\"scroll\"><table class=\"sortable leaderboard\" id=\"{e(table_id)}\"><thead><tr>"
            f"{''.join(head)}</tr></thead><tbody>\n" + "\n".join(body) + "\n</tbody></table></div>"
            "<p class=\"meta\">† speed rank: by median speedup among rows of the same group and hardware "
            "(never across machines). Speed columns sort within hardware.</p>")


def model_table_html(t: ModelTable) -> str:
    """Predicted vs measured at every k for one setting; the recommended k is highlighted."""
    c = t.costs
    head = ("<tr><th>k</th><th>E[τ] predicted</th><th>τ measured</th><th>speedup predicted</th>"
            "<th>speedup measured</th><th>verify cost</th><th>note</th><th>predicted vs measured</th></tr>")
    lines = []
    for p in t.predictions:
        m = t.measured.get(p.k)
        tau_m = f"{m.acceptance_length:.2f}" if m else ""
        sp_m = m.fmt("speedup") if m else ""
        note = "extrapolated a_i" if p.extrapolated else ""
        cls = " class=\"best\"" if p.k == t.best.k else ""
        lines.append(f"<tr{cls}><td class=\"num\">{e(p.k)}</td><td class=\"num\">{p.expected_tau:.2f}</td>"
                     f"<td class=\"num\">{e(tau_m)}</td><td class=\"num\">{p.speedup:.2f}×</td><td class=\"num\">"
                     f"{e(sp_m)}</td><td>{e(p.verify_cost_source)}</td><td>{e(note)}</td>"
                     f"<td>{'⚠ DISAGREE: ' + e(t.flags[p.k]) if p.k in t.flags else ''}</td></tr>")
    meta = (f"basis: {e(Path(t.basis.source).name)} (k={e(t.basis.k)}, acceptance from "
            f"{e(t.basis.model_acceptance_source)}); draft step {c.draft_step_s * 1e3:.3f} ms, "
            f"verify forward (width {e(c.verify_width)}) {c.verify_forward_s * 1e3:.3f} ms, target step "
            f"{c.target_step_s * 1e3:.3f} ms, overhead/round {c.overhead_per_round_s * 1e3:.3f} ms "
            f"({e(c.overhead_source)}). <b>{e(t.recommendation())}</b>")
    title = f"{t.drafter} — {t.workload} — {t.hardware}, T={t.temperature:g}"
    return (f"<h4>{e(title)}</h4><p class=\"meta\">{meta}</p>"
            f"<table class=\"model\"><thead>{head}</thead><tbody>{''.join(lines)}</tbody></table>")


MODEL_ASSUMPTIONS = (
    "Speedup model (Leviathan et al. 2023, generalised to per-position acceptance): E[τ] = 1 + Σ_i Π_{j≤i} a_j; "
    "round time = k·draft_step + verify_forward(k+1) + overhead; speedup = E[τ]·target_step / round time. "
    "Positions beyond the measured k repeat the last measured a_i (marked “extrapolated”). Verification cost per width "
    "comes from the result's per-width table or the same drafter's runs at other k (interpolated linearly between "
    "measured widths, nearest width beyond them); with one measured width it is assumed to cost the same at every "
    "width (“assumed constant”; true on CPU bf16 up to ~8 tokens, optimistic elsewhere).")


def images(paths: list[Path], src: Callable[[Path], str]) -> str:
    return "".join(f"<p><img src=\"{e(src(p))}\" alt=\"{e(p.stem)}\"></p>" for p in paths)


def notes_box(notes: list[str], heading: str) -> str:
    if not notes:
        return ""
    items = "".join(f"<li>{e(n)}</li>" for n in notes)
    return f"<div class=\"note\"><b>{e(heading)}</b><ul>{items}</ul></div>"
