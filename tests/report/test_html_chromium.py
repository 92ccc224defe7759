"""The leaderboard page renders in headless Chromium: a non-blank screenshot, and the table's rows
read back from the DOM (in order, and re-sorted by the page's own JavaScript).

Chromium comes from scripts/install_chromium.sh (Debian package). Without /usr/bin/chromium the
test skips, unless DRAFTSMITH_REQUIRE_CHROMIUM=1 (as CI sets), which makes it fail instead.
"""
from __future__ import annotations

import os
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from draftsmith.report.leaderboard_site import build_leaderboard

CHROMIUM = Path(os.environ.get("DRAFTSMITH_CHROMIUM", "/usr/bin/chromium"))


def chromium() -> Path:
    if not CHROMIUM.exists():
        reason = f"{CHROMIUM} is absent; install it with `bash scripts/install_chromium.sh`"
        if os.environ.get("DRAFTSMITH_REQUIRE_CHROMIUM") == "1":
            pytest.fail(reason + " (DRAFTSMITH_REQUIRE_CHROMIUM=1 requires it)")
        pytest.skip(reason)
    return CHROMIUM


def run_chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.glob('profile-*')))}"
    cmd = [str(chromium()), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
           f"--user-data-dir={profile}", "--hide-scrollbars", *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stderr[-2000:]}"
    return proc


class TableRows(HTMLParser):
    """(data-row, cell texts) of every <tr data-row> in the document, in DOM order."""

    def __init__(self):
        super().__init__()
        self.rows: list[tuple[str, list[str]]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "tr" and "data-row" in attrs:
            self.rows.append((attrs["data-row"], []))
        elif tag == "td" and self.rows and self._cell is None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1][1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def dom_rows(dom: str) -> list[tuple[str, list[str]]]:
    parser = TableRows()
    parser.feed(dom)
    return parser.rows


def test_page_renders_in_headless_chromium(three_results, tmp_path):
    chromium()
    out = build_leaderboard(three_results, tmp_path / "lb")
    url = out.index_html.resolve().as_uri()

    shot = tmp_path / "screenshot.png"
    run_chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1000", url)
    img = imread(shot)
    assert img.shape[:2] == (1000, 1400)
    assert float(np.var(img[..., :3])) > 1e-3, "screenshot is blank"

    rows = dom_rows(run_chromium(tmp_path, "--dump-dom", url).stdout)
    assert [(r.split("|")[0], r.split("|")[3], r.split("|")[2]) for r, _ in rows] == [
        ("stories260K", "mt_bench", "eagle3-a"), ("stories260K", "mt_bench", "medusa-b"),
        ("stories260K", "spec_bench", "medusa-b"), ("stories260K", "spec_bench", "eagle3-a"),
        ("tiny-llama", "spec_bench", "ngram")]
    assert [cells[8] for _r, cells in rows] == ["2.00", "1.60", "2.80", "2.50", "1.40"]  # acceptance length column

    # The page's JavaScript sorts a speed column within hardware, inside each group's own table
    # (mt_bench, then spec_bench): cpu rows first, then the GPU rows.
    sorted_rows = dom_rows(run_chromium(tmp_path, "--dump-dom", url + "#sort=speedup:desc").stdout)
    # cells[10] is the engine τ column (no result here ran `eval --engine`), cells[11] the speedup
    assert {cells[10] for _r, cells in sorted_rows} == {"—"}
    stories = [(r.split("|")[6].split(":")[0], cells[11]) for r, cells in sorted_rows if r.startswith("stories260K")]
    assert stories == [("cpu", "1.10×"), ("cuda", "1.90×"), ("cpu", "1.30×"), ("cuda", "2.50×")]
