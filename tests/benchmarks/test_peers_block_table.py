"""benchmarks/peers_block_table.py --pool: seeds run one file each are pooled per (steps, kind, settings),
files with other settings stay apart, the per-seed ratio pairs the same seed, and a seed listed twice stops."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import load_repo_module

REPO = Path(__file__).resolve().parents[2]


def table():
    return load_repo_module("benchmarks/peers_block_table.py")


def write(path: Path, overrides: list[str], runs: list[dict]) -> Path:
    path.write_text(json.dumps({"protocol": {"overrides": overrides, "peer_anchors": None, "peer_loss": None}, "runs": runs}))
    return path


def run(seed: int, ds: float, sp: float | None, pos: list[float]) -> dict:
    row = {"kind": "dflash", "steps": 300, "seed": seed, "draftsmith_tau": ds, "draftsmith_per_position": pos}
    if sp is not None:
        row |= {"speculators_tau": sp, "speculators_per_position": [p / 2 for p in pos]}
    return row


def test_pool_by_settings_and_pair_seeds(tmp_path):
    tuned = ["train.lr=3e-3", "drafter.num_anchors=128"]
    files = [write(tmp_path / "a.json", tuned, [run(0, 1.8, 1.5, [0.4, 0.2])]),
             write(tmp_path / "b.json", list(reversed(tuned)), [run(1, 2.0, 2.0, [0.6, 0.4]), run(2, 1.6, None, [0.2, 0.0])]),
             write(tmp_path / "recipe.json", [], [run(0, 1.2, 1.2, [0.1, 0.0])])]
    rows = table().pooled_rows(files)
    assert len(rows) == 2  # the override order does not split a group; other settings do
    tuned_row = next(r for r in rows if r["overrides"])
    assert tuned_row["files"] == ["a.json", "b.json"]
    assert tuned_row["draftsmith"]["seeds"] == [0, 1, 2]
    assert tuned_row["draftsmith"]["taus"] == [1.8, 2.0, 1.6]
    assert tuned_row["draftsmith"]["pos"] == pytest.approx([0.4, 0.2])  # mean of [0.4 0.6 0.2], [0.2 0.4 0.0]
    assert tuned_row["speculators"]["seeds"] == [0, 1]
    assert tuned_row["speculators"]["pos"] == pytest.approx([0.25, 0.15])
    assert tuned_row["ratios"] == pytest.approx([1.8 / 1.5, 1.0])  # seed 2 has no peer run: not paired


def test_pool_refuses_a_seed_twice(tmp_path):
    files = [write(tmp_path / "a.json", [], [run(0, 1.8, 1.5, [0.4])]), write(tmp_path / "b.json", [], [run(0, 1.7, 1.5, [0.4])])]
    with pytest.raises(SystemExit, match="seed listed twice"):
        table().pooled_rows(files)


def test_pool_prints_one_line_per_trainer(tmp_path, capsys):
    f = write(tmp_path / "a.json", [], [run(0, 1.8, 1.5, [0.4, 0.2]), run(1, 2.0, 2.0, [0.6, 0.4])])
    assert table().main(["--pool", str(f)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4  # header, rule, draftsmith, speculators
    assert "1.900 ± 0.141" in lines[2] and "1.10x (1.20x / 1.00x)" in lines[2]
    assert "1.750 ± 0.354" in lines[3]
