"""End to end: generate() at T = 1 reproduces the target's distribution over whole continuations
(Leviathan et al. 2023, theorem 1), on toy targets of fixed logits (tests/eval/eval_toys.py).

Each run drafts with a proposer whose distribution q differs from the target's p, through the real
loop (prefill, draft, one verification forward, accept/resample/bonus, cache rollback, proposer
commit). The joint law of new tokens 2 and 3 and the marginal of token 4 must be the target's own
autoregressive law; the draft's law must be rejected by the same test (the test has power)."""
from __future__ import annotations

import torch
from eval_toys import fixed_logit_target
from test_verification import chi_square_pvalue

from draftsmith.core.sampling import SamplingParams
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads.draft_lm import DraftModelProposer

V, RUNS = 8, 1000  # V a multiple of 4: the toy model splits hidden size V over 2 rotary heads


def _tables():
    g = torch.Generator().manual_seed(11)
    p_logits = 2.0 * torch.randn(V, V, generator=g)  # row x: logits of the token after x
    q_logits = p_logits + 2.0 * torch.randn(V, V, generator=g)  # a drafter that is often wrong
    return p_logits, q_logits


def _laws(logits: torch.Tensor, first: torch.Tensor):
    """(joint of tokens 2 and 3 [V, V], marginal of token 4 [V]) of the chain with transition
    softmax(logits), token 1 distributed as `first`."""
    P = torch.softmax(logits.double(), -1)  # [V, V]
    t2 = first @ P  # [V]
    joint23 = t2[:, None] * P  # [V, V]
    t4 = joint23.sum(0) @ P  # [V]
    return joint23, t4


def test_generate_reproduces_the_target_law_at_t1():
    p_logits, q_logits = _tables()
    target = fixed_logit_target(p_logits)
    proposer = DraftModelProposer(fixed_logit_target(q_logits).model, V)
    cfg = LoopConfig(k=3, max_new_tokens=4, sampling=SamplingParams(temperature=1.0), eos_ids=[])
    gen = torch.Generator().manual_seed(0)
    prompt = torch.tensor([0])
    counts23, counts4 = torch.zeros(V, V), torch.zeros(V)
    proposed = accepted = 0
    for _ in range(RUNS):
        g = generate(target, proposer, prompt, cfg, gen)
        assert len(g.tokens) == 4
        counts23[g.tokens[1], g.tokens[2]] += 1
        counts4[g.tokens[3]] += 1
        proposed += sum(r.proposed for r in g.rounds)
        accepted += sum(r.accepted for r in g.rounds)
    assert 0.2 < accepted / proposed < 0.9  # both accept and reject paths are exercised
    first = torch.softmax(p_logits[0].double(), -1)
    joint23, t4 = _laws(p_logits, first)
    assert chi_square_pvalue(counts23.flatten(), joint23.flatten()) > 1e-3
    assert chi_square_pvalue(counts4, t4) > 1e-3
    # power: the drafter's own law (what a loop that accepted every draft would emit) is rejected
    q_joint23, _ = _laws(q_logits, first)
    assert chi_square_pvalue(counts23.flatten(), q_joint23.flatten()) < 1e-6
