"""Shared test fixtures: tiny targets built in code, and the ../shared directory.

Tests that need ../shared call `shared_path(...)`: it skips with a clear reason when the
directory is absent, and fails instead when DRAFTSMITH_REQUIRE_SHARED=1 (as CI sets).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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
    from draftsmith import target

    return target.load(str(shared_path(STORIES)))
