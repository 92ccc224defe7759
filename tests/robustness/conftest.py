"""Fixtures of the robustness harness: the world of valid inputs (built once per session through
the real `train` and `eval` commands) and `check`, which runs one generated case in a fresh copy
of it and fails with every broken promise."""
from __future__ import annotations

import itertools
import os
import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.configuration import set_hypothesis_home_dir

from tests.robustness import sandbox, world

EXAMPLES_ENV = "DRAFTSMITH_HARNESS_EXAMPLES"
# Hypothesis's pytest plugin writes a patch file of failing examples (xfailed ones too) under
# .hypothesis/ in the working directory; keep it out of the repository.
set_hypothesis_home_dir(Path(tempfile.gettempdir()) / "draftsmith-hypothesis")


def harness_settings(ci_examples: int):
    """The fixed CI profile: derandomized (the same inputs on every run), no shrinking (a found case
    is reported as generated, so a failure costs one case, not hundreds), no example database
    (nothing written into the repository), no per-example deadline (each case has its own CPU-time
    budget in sandbox.run). DRAFTSMITH_HARNESS_EXAMPLES=N runs N fresh random inputs per test instead."""
    more = int(os.environ.get(EXAMPLES_ENV, "0") or 0)
    return settings(max_examples=more or ci_examples, derandomize=not more, deadline=None, database=None,
                    phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
                    print_blob=False, report_multiple_bugs=False)


@pytest.fixture(scope="session")
def world_dir(tmp_path_factory) -> Path:
    import draftsmith.commands.eval  # noqa: F401  (imported once here, so every forked case starts warm)
    import draftsmith.commands.inspect  # noqa: F401
    import draftsmith.commands.leaderboard  # noqa: F401
    import draftsmith.commands.report  # noqa: F401
    import draftsmith.export.api  # noqa: F401
    import draftsmith.train.loop  # noqa: F401

    return world.build(tmp_path_factory.mktemp("harness-world"))


@pytest.fixture(scope="session")
def check(world_dir, tmp_path_factory):
    """check(case, damages=()) -> Outcome: copy the world, apply the damages, run the case, assert
    the contract (sandbox.violations). A passing case's sandbox is removed; a failing one is kept."""
    root = tmp_path_factory.mktemp("harness-cases")
    counter = itertools.count()

    def run(case: sandbox.Case, damages=()) -> sandbox.Outcome:
        box = world.copy(world_dir, root / f"case{next(counter):04d}")
        for damage in damages:
            damage.apply(box)
        before = sandbox.snapshot(box)
        outcome = sandbox.run(case, box)
        found = sandbox.violations(case, outcome, before, sandbox.snapshot(box))
        if found:
            labels = "; ".join(d.label for d in damages) or case.label
            raise AssertionError(
                f"draftsmith {' '.join(case.argv)}\n  input: {labels}\n  sandbox: {box}\n  exit {outcome.code} "
                f"in {outcome.seconds:.1f} s ({outcome.cpu_seconds:.1f} CPU s), max RSS {outcome.max_rss_mb:.0f} MB\n  violations:\n    - "
                + "\n    - ".join(found) + f"\n  stderr tail: {outcome.stderr[-1500:]}\n  stdout tail: {outcome.stdout[-500:]}")
        shutil.rmtree(box, ignore_errors=True)
        return outcome

    return run
