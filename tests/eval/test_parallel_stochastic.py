"""Stochastic verification stays exact with the parallel drafters in the one loop: on a toy target of
fixed logits (tests/eval/eval_toys.py), the first three tokens of T = 1 generations follow the
target's own joint distribution (chi-square), although every round's drafts come from a block /
placeholder forward (and DSpark's Markov chain over the slots)."""
from __future__ import annotations

import pytest
import torch
from eval_toys import fixed_logit_target
from test_verification import chi_square_pvalue

from draftsmith.core.sampling import SamplingParams
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads import DRAFTERS

V = 4
OPTIONS = {"dflash": {"block_size": 3, "num_layers": 1}, "dspark": {"block_size": 2, "num_layers": 1, "markov_rank": 2,
                                                                    "confidence_threshold": 0.0},
           "peagle": {"num_depths": 2}}


@pytest.mark.parametrize("kind", list(OPTIONS))
def test_first_tokens_follow_the_target_joint(kind):
    torch.manual_seed(0)
    table = torch.randn(V, V) * 1.5
    target = fixed_logit_target(table)
    cls = DRAFTERS.get(kind)
    drafter = cls.from_target(cls.Config(mask_token_id=0, **OPTIONS[kind]), target)
    with torch.no_grad():  # a drafter whose q differs from p, so rejections happen
        for p in drafter.parameters():
            p.add_(torch.randn_like(p))
    drafter.eval()
    proposer = drafter.make_proposer(target)
    prompt = torch.tensor([1, 2])
    g = torch.Generator().manual_seed(1)
    cfg = LoopConfig(k=2, max_new_tokens=4, sampling=SamplingParams(temperature=1.0), eos_ids=[])
    n = 600
    counts = torch.zeros(V, V, V)
    proposed = 0
    for _ in range(n):
        out = generate(target, proposer, prompt, cfg, g)
        counts[tuple(out.tokens[:3])] += 1
        proposed += out.rounds[0].proposed
    p = torch.softmax(table, -1)
    joint = p[2][:, None, None] * p[:, :, None] * p[None].expand(V, V, V)  # [a, b, c]: p(a|2) p(b|a) p(c|b)
    assert proposed == 2 * n  # the first round after the prefill drafts 2 tokens in one forward
    assert chi_square_pvalue(counts.flatten(), joint.flatten()) > 1e-3
