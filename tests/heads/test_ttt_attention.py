"""Memory-lean TTT attention: the chunked and flex kernels equal today's eager kernel in fp32
(outputs and gradients), and the chunked kernel keeps no quadratic tensor for backward."""
from __future__ import annotations

import warnings

import pytest
import torch

from draftsmith.heads.draft_layer import ttt_attention

warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


def inputs(b=2, heads=4, kv_heads=2, n=13, d=8, steps=3, packed=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, n, d, generator=g, requires_grad=True)
    # earlier steps are longer than later ones (step s covers n + steps - 1 - s positions)
    kv = [tuple(torch.randn(b, kv_heads, n + steps - 1 - s, d, generator=g, requires_grad=True) for _ in range(2))
          for s in range(steps)]
    docs = None
    if packed:
        docs = torch.tensor([[0] * 5 + [1] * 4 + [2] * (n + 2 - 9), [0] * (n - 3) + [-1] * 5])[:, : n + 2]
    return q, kv, docs


def run(impl, q, kv, docs, chunk=4):
    o = ttt_attention(q, kv, docs, q.shape[-1] ** -0.5, impl, chunk)
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(9))
    grads = torch.autograd.grad((o * w).sum(), [q, *[t for pair in kv for t in pair]])
    return o.detach(), grads


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("steps", [1, 3])
@pytest.mark.parametrize("impl,chunk", [("chunked", 4), ("chunked", 5), ("chunked", 64)])
def test_kernels_equal_eager_in_fp32(impl, chunk, steps, packed):
    q, kv, docs = inputs(steps=steps, packed=packed)
    ref_o, ref_g = run("eager", q, kv, docs)
    o, g = run(impl, q, kv, docs, chunk or 4)
    torch.testing.assert_close(o, ref_o, rtol=1e-5, atol=1e-6)
    for got, want in zip(g, ref_g):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("steps", [1, 3])
def test_flex_forward_equals_eager_on_cpu(steps, packed):
    """flex_attention has no CPU backward (torch 2.13); its gradients are checked by the GPU tests."""
    q, kv, docs = inputs(steps=steps, packed=packed)
    with torch.no_grad():
        ref = ttt_attention(q, kv, docs, q.shape[-1] ** -0.5, "eager")
        got = ttt_attention(q, kv, docs, q.shape[-1] ** -0.5, "flex")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def peak_bytes(impl, n):
    """Peak bytes allocated during forward + backward of one TTT step (t = 3) at n positions
    (draftsmith.train.memory: every storage created by an op, freed when it dies)."""
    from draftsmith.train.memory import PeakMemory

    q, kv, _ = inputs(b=1, heads=4, kv_heads=2, n=n, d=8, steps=4)
    with PeakMemory() as mem:
        ttt_attention(q, kv, None, 8 ** -0.5, impl, 64).sum().backward()
    return mem.peak


def test_chunked_peak_memory_is_linear_in_n():
    n = 512
    scores = 4 * n * n * 4  # one [1, H=4, n, n] fp32 score tensor
    eager, chunked = peak_bytes("eager", n), peak_bytes("chunked", n)
    assert eager > 3 * scores  # today's kernel holds several quadratic tensors at once
    assert chunked < scores  # the chunked one never holds one
    assert peak_bytes("eager", 2 * n) > 3.5 * eager  # quadratic
    assert peak_bytes("chunked", 2 * n) < 2.5 * chunked  # linear


def test_eagle3_loss_and_grads_equal_across_kernels_and_checkpointing():
    from tests.heads.test_eagle3 import batch_for, make

    target, drafter = make(ttt_steps=3, draft_vocab_size=200)
    batch = batch_for(target, drafter, s=16)
    results = []
    for impl, ckpt in [("eager", False), ("chunked", False), ("chunked", True), ("eager", True)]:
        drafter.midlayer.self_attn.ttt_impl, drafter.midlayer.self_attn.ttt_chunk = impl, 5
        drafter.midlayer.gradient_checkpointing = ckpt
        drafter.zero_grad()
        out = drafter(batch)
        out.loss.backward()
        results.append((out.loss.detach(), [p.grad.clone() for p in drafter.trainable_parameters()]))
    ref_loss, ref_grads = results[0]
    for loss, grads in results[1:]:
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
        for got, want in zip(grads, ref_grads):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
