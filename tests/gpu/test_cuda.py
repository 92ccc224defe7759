"""GPU checks (`pytest -m gpu`, run by scripts/device_check.sh; skipped without CUDA):
flex/chunked TTT attention equal to eager on CUDA (fp32, with gradients), a bf16 EAGLE-3
training step, and the speculative loop staying lossless on CUDA."""
from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/device_check.sh)")]


def test_flex_and_chunked_equal_eager_on_cuda_with_grads():
    from draftsmith.heads.draft_layer import ttt_attention

    g = torch.Generator(device="cuda").manual_seed(0)
    b, heads, kv_heads, n, d, steps = 2, 8, 2, 200, 64, 4
    docs = torch.cat([torch.zeros(b, 120, dtype=torch.long), torch.ones(b, n + steps - 120, dtype=torch.long)], 1).cuda()
    for packed in (None, docs):
        q = torch.randn(b, heads, n, d, device="cuda", generator=g, requires_grad=True)
        kv = [tuple(torch.randn(b, kv_heads, n + steps - 1 - s, d, device="cuda", generator=g, requires_grad=True)
                    for _ in range(2)) for s in range(steps)]
        leaves = [q, *[t for pair in kv for t in pair]]
        w = torch.randn(b, heads, n, d, device="cuda", generator=g)
        results = {}
        for impl in ("eager", "chunked", "flex"):
            o = ttt_attention(q, kv, packed, d ** -0.5, impl, 64)
            results[impl] = (o.detach(), torch.autograd.grad((o * w).sum(), leaves))
        for impl in ("chunked", "flex"):
            torch.testing.assert_close(results[impl][0], results["eager"][0], rtol=1e-4, atol=1e-4)
            for got, want in zip(results[impl][1], results["eager"][1]):
                torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-4)


def test_bf16_training_step_on_cuda(tiny_run):
    from draftsmith.train.loop import train

    fp32 = train(tiny_run("fp32", "target.device=cuda", "train.precision=fp32", "train.max_steps=3"))
    bf16 = train(tiny_run("bf16", "target.device=cuda", "train.precision=bf16", "train.max_steps=3"))
    assert all(torch.isfinite(torch.tensor(bf16.losses)))
    assert bf16.losses[0] == pytest.approx(fp32.losses[0], rel=0.05)


def test_cuda_speculative_loop_is_lossless():
    from draftsmith.eval.loop import LoopConfig, generate
    from draftsmith.heads.eagle3 import Eagle3Drafter
    from draftsmith.testing import tiny_target

    target = tiny_target(num_layers=4, hidden=32, seed=0)
    target.model.to("cuda")
    torch.manual_seed(1)
    drafter = Eagle3Drafter.from_target(Eagle3Drafter.Config(ttt_steps=2), target).eval()
    ids = torch.randint(3, target.vocab_size, (12,))
    with torch.no_grad():
        ref = generate(target, None, ids, LoopConfig(k=0, max_new_tokens=32, eos_ids=[])).tokens
        got = generate(target, drafter.make_proposer(target), ids, LoopConfig(k=4, max_new_tokens=32, eos_ids=[])).tokens
    assert got == ref


def test_cuda_peak_memory_of_chunked_ttt_is_linear():
    from draftsmith.heads.draft_layer import ttt_attention
    from draftsmith.train.memory import PeakMemory

    def peak(impl, n):
        q = torch.randn(1, 32, n, 128, device="cuda", requires_grad=True)
        kv = [tuple(torch.randn(1, 8, n, 128, device="cuda", requires_grad=True) for _ in range(2)) for _ in range(4)]
        with PeakMemory("cuda") as mem:
            ttt_attention(q, kv, None, 128 ** -0.5, impl, 256).sum().backward()
        return mem.peak

    assert peak("chunked", 4096) < 2.5 * peak("chunked", 2048)
    assert peak("flex", 4096) < 2.5 * peak("flex", 2048)
    assert peak("eager", 4096) > 3.0 * peak("eager", 2048)
