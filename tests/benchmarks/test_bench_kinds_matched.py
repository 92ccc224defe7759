"""benchmarks/bench_drafter_kinds.py --matched: every matched-size option set builds a drafter whose
trainable parameters are within 25 % of EAGLE-3's at its recipe (the table calls them matched)."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import STORIES, shared_path
from tests.helpers import load_repo_module

REPO = Path(__file__).resolve().parents[2]


def load(name: str):
    return load_repo_module(f"benchmarks/{name}.py")


@pytest.mark.shared
def test_matched_options_are_within_a_quarter_of_eagle3(monkeypatch):
    shared_path(STORIES)  # the debug recipes load stories260K from ../shared
    monkeypatch.chdir(REPO)
    kinds, params = load("bench_drafter_kinds"), load("kind_params")
    reference = params.trainable_params("eagle3", [])
    sizes = {kind: params.trainable_params(kind, options) for kind, options in kinds.MATCHED.items()}
    sizes["dflash"] = params.trainable_params("dflash", [])  # matched at its defaults, as the module says
    far = {kind: n for kind, n in sizes.items() if not 0.75 * reference <= n <= 1.25 * reference}
    assert not far, f"not within 25 % of EAGLE-3's {reference:,}: {far}"
    assert set(kinds.MATCHED) | {"eagle3", "dflash"} == set(kinds.KINDS)  # every kind has a matched row
