"""Issue 11: every value written into a page is escaped, attributes included."""
from __future__ import annotations

import dataclasses

from result_files import make_result, write

from draftsmith.report import html as H
from draftsmith.report.leaderboard import build_rows
from draftsmith.report.results_io import load_results

EVIL = '1" onmouseover="alert(1)'


def test_values_in_attributes_and_links_are_escaped(tmp_path):
    results, _ = load_results([write(tmp_path / 'r"x.json', make_result())])
    row = dataclasses.replace(build_rows(results)[0], k=EVIL, hardware=EVIL, source=str(tmp_path / 'a"b.json'))
    page = H.leaderboard_table([row], link=H.relative_src(tmp_path), table_id=EVIL)
    assert 'onmouseover="alert' not in page and '"a"b.json"' not in page
    assert page.count("&quot;") >= 6  # k's cell and data-v, data-hardware, the id, the href and the link text
    assert H.e(3) == "3" and H.e("<b>") == "&lt;b&gt;"
