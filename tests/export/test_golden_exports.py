"""Exports stay byte for byte what they were: every kind x every in-process format (at the newest engine release
that serves the kind), exported from the same seeded tiny checkpoints, must hash as recorded in
golden_exports.json, and doctor must give the same verdict on each export's own serve command. A change meant to
alter exports rewrites the file (`python tests/export/golden_exports.py tests/export/golden_exports.json`) and
says why in its commit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from golden_exports import collect

GOLDEN = Path(__file__).resolve().parent / "golden_exports.json"


@pytest.mark.slow
def test_every_export_and_doctor_verdict_is_as_recorded(tmp_path):
    want = json.loads(GOLDEN.read_text())
    got = collect(tmp_path)
    assert sorted(got) == sorted(want), "the (kind, format) pairs exported changed"
    changed = {pair: [f for f in set(got[pair]["files"]) | set(want[pair]["files"])
                      if got[pair]["files"].get(f) != want[pair]["files"].get(f)]
               for pair in want if got[pair]["files"] != want[pair]["files"]}
    assert not changed, f"exported files differ from golden_exports.json: {changed}"
    verdicts = {pair: (want[pair]["doctor"], got[pair]["doctor"]) for pair in want if got[pair]["doctor"] != want[pair]["doctor"]}
    assert not verdicts, f"doctor's verdicts differ (recorded, now): {verdicts}"
