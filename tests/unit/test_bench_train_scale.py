"""bench_train_scale: its fake-tensor memory count equals a real run's, and its 'new' step
computes today's loss (so the benchmark compares equal work)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_train_scale.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_train_scale", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", ["today", "new"])
def test_fake_memory_equals_real_memory(bench, path):
    shape = bench.SHAPES["tiny"]
    real = bench.measure(path, shape, 64, 2, "cpu", fake=False, chunk=32)
    fake = bench.measure(path, shape, 64, 2, "cpu", fake=True, chunk=32)
    assert real["peak_bytes"] > 0
    assert fake["peak_bytes"] == pytest.approx(real["peak_bytes"], rel=0.02)


def test_new_step_computes_todays_loss(bench):
    shape = bench.SHAPES["tiny"]
    losses = {}
    for path, step in (("today", bench.step_today), ("new", bench.step_new)):
        drafter, lm_head = bench.build_drafter(shape, 3, "cpu")
        batch = bench.synthetic_batch(shape, 40, "cpu")
        losses[path] = float((step(drafter, lm_head, batch) if path == "today" else step(drafter, lm_head, batch, 16)).detach())
    assert losses["new"] == pytest.approx(losses["today"], rel=2e-3)
