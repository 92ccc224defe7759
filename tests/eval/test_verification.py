"""Verification rules: greedy cases, and chi-square tests that exact stochastic verification
reproduces the target distribution p (Leviathan et al. 2023, theorem 1)."""
from __future__ import annotations

import pytest
import torch

from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample, verify, verify_greedy, verify_stochastic

N = 4000  # samples per test: enough power (see the negative controls), ~2 s each on one core


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor, min_expected: float = 5.0) -> float:
    """Pearson chi-square goodness of fit; cells expected < min_expected are pooled into one."""
    counts, expected = counts.double(), probs.double() * counts.sum()
    small = expected < min_expected
    if small.any():
        counts = torch.cat([counts[~small], counts[small].sum().view(1)])
        expected = torch.cat([expected[~small], expected[small].sum().view(1)])
    keep = expected > 0
    if counts[~keep].sum() > 0:  # a token of probability 0 was emitted: certainly not p
        return 0.0
    counts, expected = counts[keep], expected[keep]
    stat = ((counts - expected) ** 2 / expected).sum()
    df = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))  # chi2 survival function


def test_greedy_prefix_and_bonus():
    logits = torch.zeros(4, 8)
    logits[0, 3], logits[1, 5], logits[2, 1], logits[3, 7] = 1, 1, 1, 1  # target choices 3, 5, 1, 7
    assert verify_greedy(torch.tensor([3, 5, 1]), logits).__dict__ == {"accepted": 3, "token": 7}
    assert verify_greedy(torch.tensor([3, 4, 1]), logits).__dict__ == {"accepted": 1, "token": 5}
    assert verify_greedy(torch.tensor([2, 5, 1]), logits).__dict__ == {"accepted": 0, "token": 3}
    assert verify_greedy(torch.empty(0, dtype=torch.long), logits[:1]).__dict__ == {"accepted": 0, "token": 3}


def _first_token_counts(p, q, gen, draft_from_q=True):
    counts = torch.zeros(p.shape[-1])
    for _ in range(N):
        d = sample(q, gen).view(1)
        v = verify_stochastic(d, q[None] if draft_from_q else None, torch.stack([p, p]), gen)
        counts[d.item() if v.accepted else v.token] += 1
    return counts


@pytest.mark.parametrize("params", [SamplingParams(1.0), SamplingParams(0.7, top_k=3), SamplingParams(1.3, top_p=0.8)])
def test_stochastic_first_token_matches_p(params):
    gen = torch.Generator().manual_seed(0)
    p = logits_to_probs(torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, 1.5]), params)
    q = logits_to_probs(torch.tensor([0.0, 2.0, 0.5, 1.0, 1.0, -2.0]), params)
    assert chi_square_pvalue(_first_token_counts(p, q, gen), p) > 1e-3
    # power check: the drafts themselves (what a rule accepting everything emits) fail the same test
    assert chi_square_pvalue(torch.bincount(sample(q.expand(N, -1), gen), minlength=6), p) < 1e-6


def test_deterministic_proposer_one_hot_q():
    gen = torch.Generator().manual_seed(1)
    p = torch.tensor([0.1, 0.6, 0.3])
    counts = torch.zeros(3)
    for _ in range(N):
        v = verify_stochastic(torch.tensor([1]), None, torch.stack([p, p]), gen)  # always proposes token 1
        counts[1 if v.accepted else v.token] += 1
    assert chi_square_pvalue(counts, p) > 1e-3


def test_stochastic_chain_reproduces_joint_of_two_tokens():
    """k = 3 chains under Markov p(.|prev) and q(.|prev): the first two emitted tokens are ~ p x p."""
    gen = torch.Generator().manual_seed(2)
    V, k = 4, 3
    P = torch.softmax(torch.randn(V, V, generator=gen) * 1.5, -1)  # [prev, next]
    Q = torch.softmax(torch.randn(V, V, generator=gen) * 1.5, -1)
    start = 0
    counts = torch.zeros(V, V)
    for _ in range(N):
        out, prev = [], start
        while len(out) < 2:  # rounds until two tokens are committed
            drafts, last = [], prev
            for _ in range(k):
                last = int(sample(Q[last], gen))
                drafts.append(last)
            ctx = [prev] + drafts
            v = verify_stochastic(torch.tensor(drafts), Q[ctx[:-1]], P[ctx], gen)
            out += drafts[: v.accepted] + [v.token]
            prev = out[-1]
        counts[out[0], out[1]] += 1
    joint = P[start][:, None] * P  # [V, V]: p(x1 | start) p(x2 | x1)
    assert chi_square_pvalue(counts.flatten(), joint.flatten()) > 1e-3
    # power check: the same number of samples from q x q (the drafts) is rejected
    q_joint = (Q[start][:, None] * Q).flatten()
    assert chi_square_pvalue(torch.bincount(sample(q_joint.expand(N, -1), gen), minlength=V * V), joint.flatten()) < 1e-6


def test_verify_dispatch_greedy_ignores_probs():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 0.0]])
    v = verify(torch.tensor([1]), None, logits, SamplingParams(0.0))
    assert (v.accepted, v.token) == (1, 0)
