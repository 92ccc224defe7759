"""bench_train_scale: its fake-tensor memory count equals a real run's, and its 'new' step
computes today's loss (so the benchmark compares equal work)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import load_repo_module


@pytest.fixture(scope="module")
def bench():
    return load_repo_module("benchmarks/bench_train_scale.py")


@pytest.mark.parametrize("path", ["today", "new", "lean"])
def test_fake_memory_equals_real_memory(bench, path):
    shape = bench.SHAPES["tiny"]
    real = bench.measure(path, shape, 64, 2, "cpu", fake=False, chunk=32)
    fake = bench.measure(path, shape, 64, 2, "cpu", fake=True, chunk=32)
    assert real["peak_bytes"] > 0
    assert fake["peak_bytes"] == pytest.approx(real["peak_bytes"], rel=0.02)


def test_new_and_lean_steps_compute_todays_loss_and_gradients(bench):
    shape = bench.SHAPES["tiny"]
    losses, grads = {}, {}
    for path, step in (("today", bench.step_today), ("new", bench.step_new), ("lean", bench.step_lean)):
        drafter, lm_head = bench.build_drafter(shape, 3, "cpu")
        batch = bench.synthetic_batch(shape, 40, "cpu")
        loss = step(drafter, lm_head, batch) if path == "today" else step(drafter, lm_head, batch, 16)
        losses[path] = float(loss.detach())
        grads[path] = drafter.fc.weight.grad.clone()
    for path in ("new", "lean"):
        assert losses[path] == pytest.approx(losses["today"], rel=2e-3), path
        torch.testing.assert_close(grads[path], grads["today"], rtol=2e-2, atol=1e-5, msg=path)
