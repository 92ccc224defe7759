"""The harness's own budget (issue 34): a case is bounded by the CPU time it uses, not by the wall
clock, so a busy machine (a case waiting for a core) does not kill an honest case, while a case that
spins is still stopped; the wall clock is only a backstop for a case that blocks."""
from __future__ import annotations

import time

from tests.robustness import sandbox


def _run(monkeypatch, tmp_path, body, seconds: float) -> sandbox.Outcome:
    """Run `body` in the sandbox's forked child in place of draftsmith's main (the child inherits the patch)."""
    monkeypatch.setattr("draftsmith.cli.main", lambda argv: body())
    return sandbox.run(sandbox.Case(argv=["x"], names=[], seconds=seconds), tmp_path)


def _spin() -> int:
    while True:
        pass


def _sleep_then_work() -> int:
    time.sleep(2.5)  # waiting (as for a busy core) costs wall clock, not CPU time
    sum(range(100_000))
    return 0


def test_a_case_that_spins_is_stopped_at_its_cpu_budget(monkeypatch, tmp_path):
    out = _run(monkeypatch, tmp_path, _spin, seconds=1)
    assert out.timed_out and not out.wall_backstop and out.code is None
    assert 0.5 <= out.cpu_seconds < 3.0, out.cpu_seconds  # the kernel counts CPU time in ticks
    found = sandbox.violations(sandbox.Case(argv=["x"], names=[], seconds=1), out, {}, {})
    assert found == ["used more than its 1 CPU-second budget (SIGXCPU)"]


def test_wall_clock_past_the_budget_is_not_a_violation(monkeypatch, tmp_path):
    out = _run(monkeypatch, tmp_path, _sleep_then_work, seconds=1)
    assert out.seconds > 2.5 and out.cpu_seconds < 1.0 and out.code == 0 and not out.timed_out
    assert sandbox.violations(sandbox.Case(argv=["x"], names=[], seconds=1), out, {}, {}) == []


def test_a_case_that_blocks_is_stopped_at_the_wall_clock_backstop(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox, "WALL_FACTOR", 1)
    monkeypatch.setattr(sandbox, "WALL_FLOOR", 1.0)
    out = _run(monkeypatch, tmp_path, lambda: time.sleep(60) or 0, seconds=1)
    assert out.timed_out and out.wall_backstop and out.seconds < 30
    assert "wall-clock backstop of 1 s" in sandbox.violations(sandbox.Case(argv=["x"], names=[], seconds=1),
                                                             out, {}, {})[0]


def test_the_backstop_leaves_a_wide_margin():
    assert sandbox.wall_backstop(8) >= 5 * 8 and sandbox.wall_backstop(60) == 600
