"""The memory-lean draft-vocabulary loss equals the straightforward one (today's EAGLE-3 step loss)
in value and gradients, and its peak memory does not hold full-vocabulary fp32 logits."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from draftsmith.heads import vocab_loss

V, DV, H = 1024, 256, 16


def setup(b=2, n=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    draft_ids = torch.randperm(V, generator=g)[:DV].sort().values
    target_logits = torch.randn(b, n, V, generator=g) * 3
    head = nn.Sequential(nn.LayerNorm(H), nn.Linear(H, DV, bias=False))
    hidden = torch.randn(b, n, H, generator=g, requires_grad=True)
    mask = (torch.rand(b, n, generator=g) > 0.3).float()
    with torch.no_grad():  # on every other position the target agrees with the draft head (hits to count)
        agree = draft_ids[head(hidden).argmax(-1)]  # [b, n] target ids
        target_logits[:, ::2].scatter_add_(-1, agree[:, ::2, None], torch.full_like(agree[:, ::2, None], 20.0).float())
    return draft_ids, target_logits, head, hidden, mask


def reference(draft_ids, target_logits, head, hidden, mask):
    """Today's eagle3.forward_loss step: full fp32 copy, then restrict; log_softmax over all positions."""
    full = target_logits.float()
    p = torch.softmax(full[..., draft_ids], dim=-1)
    top = full.argmax(-1)
    logq = torch.log_softmax(head(hidden).float(), dim=-1)
    kl = (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1)
    hits = ((draft_ids[logq.argmax(-1)] == top).float() * mask).sum()
    return (kl * mask).sum(), hits, p, top


@pytest.mark.parametrize("chunk", [1, 8, 1000])
def test_chunked_kl_equals_reference(chunk):
    draft_ids, logits, head, hidden, mask = setup()
    ref, ref_hits, ref_p, ref_top = reference(draft_ids, logits, head, hidden, mask)
    ref_grads = torch.autograd.grad(ref, [hidden, *head.parameters()])
    p, top = vocab_loss.soft_labels(logits, draft_ids, chunk=chunk)
    torch.testing.assert_close(p, ref_p, rtol=0, atol=0)
    assert torch.equal(top, ref_top)
    got, hits = vocab_loss.chunked_kl(hidden, head, p, mask, draft_ids, top, chunk=chunk)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-5)
    assert float(hits) == float(ref_hits) > 0
    for a, b in zip(torch.autograd.grad(got, [hidden, *head.parameters()]), ref_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_labels_from_hidden_equal_labels_from_logits():
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(V, H, generator=g)
    last = torch.randn(2, 19, H, generator=g)
    draft_ids = torch.arange(0, V, 5)
    p_ref, top_ref = vocab_loss.soft_labels(last @ weight.T, draft_ids)
    p, top = vocab_loss.soft_labels_from_hidden(last, weight, draft_ids, chunk=4)
    torch.testing.assert_close(p, p_ref, rtol=1e-5, atol=1e-7)
    assert torch.equal(top, top_ref)


def test_peak_memory_stays_below_full_vocab_logits():
    from draftsmith.train.memory import PeakMemory

    draft_ids, logits, head, hidden, mask = setup(b=1, n=2048)
    logits = logits.bfloat16()  # as a bf16 target hands them over
    full_fp32 = 2048 * V * 4

    def peak(fn):
        with PeakMemory() as mem:
            fn()
        return mem.peak

    def lean():
        p, top = vocab_loss.soft_labels(logits, draft_ids, chunk=128)
        vocab_loss.chunked_kl(hidden, head, p, mask, draft_ids, top, chunk=128)[0].backward()

    def today():
        reference(draft_ids, logits, head, hidden, mask)[0].backward()

    assert peak(today) > 1.5 * full_fp32  # the fp32 copy plus the fp32 log-probabilities of every position
    assert peak(lean) < 0.5 * full_fp32
