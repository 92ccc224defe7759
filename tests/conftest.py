"""Shared test fixtures: tiny targets built in code, and the ../shared directory.

Tests that need ../shared call `shared_path(...)`: it skips with a clear reason when the
directory is absent, and fails instead when DRAFTSMITH_REQUIRE_SHARED=1 (as CI sets).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from draftsmith import config
from draftsmith.testing import tiny_target

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("DRAFTSMITH_SHARED", REPO.parent / "shared"))
STORIES = "models/stories260K-hf"

torch.set_num_threads(min(2, torch.get_num_threads()))


def shared_path(*parts: str) -> Path:
    path = SHARED.joinpath(*parts)
    if not path.exists():
        reason = f"{path} is absent (the project's ../shared copy); set DRAFTSMITH_SHARED to point at it"
        if os.environ.get("DRAFTSMITH_REQUIRE_SHARED") == "1":
            pytest.fail(reason + " and DRAFTSMITH_REQUIRE_SHARED=1 requires it")
        pytest.skip(reason)
    return path


@pytest.fixture
def tiny():
    return tiny_target()


@pytest.fixture(scope="session")
def stories_target():
    from draftsmith.targets import load as target

    return target.load(str(shared_path(STORIES)))


@pytest.fixture
def tiny_run(tmp_path):
    """A tiny target saved to disk and a small conversation file; returns a recipe factory."""
    target = tiny_target(num_layers=4, hidden=32)
    target_dir = tmp_path / "target"
    target.model.save_pretrained(target_dir)
    target.tokenizer.save_pretrained(target_dir)
    rows = [{"conversations": [{"from": "human", "value": f"question {i} about {'abc' * (i % 5)}"},
                               {"from": "gpt", "value": f"answer number {i}: " + "xyz " * (3 + i % 7)}]}
            for i in range(24)]
    data = tmp_path / "chat.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    def recipe(out: str, *overrides: str):
        raw = {"target": {"path": str(target_dir)}, "data": {"path": [str(data)], "max_length": 64, "eval_samples": 4},
               "drafter": {"kind": "eagle3", "ttt_steps": 3, "draft_vocab_size": 120},
               "train": {"output_dir": str(tmp_path / out), "max_steps": 6, "batch_size": 4, "lr": 3e-3,
                         "warmup_steps": 2, "log_every": 1},
               "logging": {"progress_bar": False}}
        return config.from_dict(raw, overrides=list(overrides))

    return recipe


def refused_in_one_line(capsys, argv: list[str], *needles: str) -> str:
    """`draftsmith ARGV` exits 2 with one stderr line that holds every needle; the line."""
    from draftsmith.cli import main as cli_main

    capsys.readouterr()
    rc = cli_main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert rc == 2 and len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
