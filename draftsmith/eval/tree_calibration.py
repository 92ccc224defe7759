"""Calibrating Medusa-style sparse trees: per-position top-k acceptance measured by running the
speculative loop (eval/loop.py) with a recorder around the proposer. It stands above both the loop and
eval/tree.py (which builds and verifies the trees the loop drafts), so neither imports the other back.

    from draftsmith.eval.tree_calibration import measure_topk_acceptance
    acceptance = measure_topk_acceptance(target, proposer, prompts, depth=4, topk=3)
"""
from __future__ import annotations

import torch

from draftsmith.eval.loop import LoopConfig, generate


class _RankRecorder:
    """Drafts a greedy chain through the tree interface and, on commit, records the rank of each
    target token in the draft distribution of the position that produced it."""

    def __init__(self, proposer, depth: int, topk: int):
        self.inner, self.depth, self.topk = proposer, depth, topk
        self.name = getattr(proposer, "name", "proposer")
        self.hits = [[0] * topk for _ in range(depth)]
        self.reached = [0] * depth
        self.logprobs: list[torch.Tensor] = []

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)
        self.logprobs = []

    def propose(self, context, k, sampling, generator=None):
        from draftsmith.heads.base import Draft

        lps = [self.inner.tree_root()]  # [V]
        tokens = [int(lps[0].argmax())]
        for d in range(1, k):
            lps.append(self.inner.tree_expand(torch.tensor([tokens[-1]]), torch.tensor([d - 2]), d)[0])
            tokens.append(int(lps[-1].argmax()))
        self.logprobs = lps
        return Draft(tokens=torch.tensor(tokens, device=context.device))

    def commit(self, context, num_new, target_out):
        committed = context[-num_new:].tolist()  # accepted drafts, then the target's own token
        for i, lp in enumerate(self.logprobs[:num_new]):  # position i was reached: all < i accepted
            rank = int((lp > lp[committed[i]]).sum())
            self.reached[i] += 1
            if rank < self.topk:
                self.hits[i][rank] += 1
        self.logprobs = []
        self.inner.commit(context, num_new, target_out)


def measure_topk_acceptance(target, proposer, prompts: list[torch.Tensor], depth: int, topk: int,
                            max_new_tokens: int = 64) -> list[list[float]]:
    """Per-position top-k acceptance, the calibration of Medusa's sparse trees (Cai et al. 2024,
    sec. 2.3.1). Steps:
    1. greedy chain rounds at k = depth (the drafter's own argmax chain, through the tree interface);
    2. at draft position i of a round whose positions < i were all accepted, find the rank of the
       target's token (the accepted draft, or the correction) in the drafter's distribution q_i;
    3. acceptance[i][r] = P(rank = r | position i reached), pooled over rounds and prompts."""
    depth = min(depth, getattr(proposer, "max_tree_depth", depth))
    rec = _RankRecorder(proposer, depth, topk)  # 2. happens in its commit()
    for ids in prompts:  # 1.
        generate(target, rec, ids, LoopConfig(k=depth, max_new_tokens=max_new_tokens))
    return [[h / n if n else 0.0 for h in hits] for hits, n in zip(rec.hits, rec.reached)]  # 3.
