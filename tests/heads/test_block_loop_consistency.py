"""Block drafters (DFlash, DSpark, DFlash 2) through the REAL speculative loop: every round's drafts equal what the
training forward (blocks_hidden, the path forward_loss trains) drafts at that round's anchor, on the
finished sequence. This pins the anchor position, the context features (target states of positions
before the anchor, committed in prefill and round pieces), the rope positions of the block, the mask
token and the draft-vocabulary mapping to the same values in training and in the loop (issue 21)."""
from __future__ import annotations

import pytest
import torch

from draftsmith.data import features
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads.dflash import DFlashDrafter
from draftsmith.heads.dflash2 import DFlash2Drafter
from draftsmith.heads.dspark import DSparkDrafter
from draftsmith.testing import tiny_target


class Recording:
    """Wraps a proposer; logs (context length, drafted tokens) of every round."""

    def __init__(self, inner):
        self.inner, self.name, self.rounds = inner, inner.name, []

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)

    def commit(self, context, num_new, target_out):
        self.inner.commit(context, num_new, target_out)

    def propose(self, context, k, sampling, generator=None):
        draft = self.inner.propose(context, k, sampling, generator)
        self.rounds.append((context.shape[0], draft.tokens.tolist()))
        return draft


def training_path_drafts(d, batch, anchor: int, n: int) -> list[int]:
    """The first n greedy drafts of the block anchored at `anchor`, from the training forward."""
    hidden = d.blocks_hidden(batch, torch.tensor([[anchor]]))[0, 0]  # [B, h]
    ids = d.draft_ids()
    if hasattr(d, "candidate_selector"):  # DFlash 2: walk the selector over each slot's unary top-K
        return selector_walk(d, hidden, batch["input_ids"][0, anchor], n)
    if not d.sample_from_anchor:  # DFlash: slots 1..n predict x_{p+1..p+n}
        return ids[d.lm_head(hidden[1 : 1 + n]).argmax(-1)].tolist()
    out, prev = [], batch["input_ids"][0, anchor].view(1)  # DSpark: slot i, Markov bias of the draft before it
    for i in range(n):
        logits, _ = d.heads(hidden[i : i + 1], prev)
        prev = ids[logits.argmax(-1)]
        out.append(int(prev))
    return out


def selector_walk(d, hidden, anchor, n: int) -> list[int]:
    """Slot i = 1..n: candidates c = top-K of lm_head(h_i); pick argmax_c U_i(c) + <A[prev] * W h_i, B[c]>,
    prev = the anchor, then the pick before (written out from the selector's weights)."""
    sel, ids, out, prev = d.candidate_selector, d.draft_ids(), [], int(anchor)
    for i in range(1, n + 1):
        unary = d.lm_head(hidden[i])
        cands = unary.topk(d.cfg.selector_top_k).indices
        ctx = sel.predecessor_codebook[prev] * (sel.hidden_projection.weight @ hidden[i])
        scores = unary[cands] + sel.successor_codebook[cands] @ ctx
        prev = int(ids[cands[scores.argmax()]])
        out.append(prev)
    return out


def as_batch(target, d, seq):
    return features.complete(target, {"input_ids": seq, "attention_mask": torch.ones_like(seq),
                                      "loss_mask": torch.ones_like(seq)}, set(d.required_features), d.feature_layers())


@pytest.mark.parametrize("window", [None, 3], ids=["full", "window3"])
@pytest.mark.parametrize("cls", [DFlashDrafter, DSparkDrafter, DFlash2Drafter], ids=["dflash", "dspark", "dflash2"])
def test_loop_drafts_equal_training_forward_at_every_round(cls, window):
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    prompt = torch.randint(3, target.vocab_size, (7,), generator=torch.Generator().manual_seed(11))
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=40))
    seq = torch.cat([prompt, torch.tensor(base.tokens)])
    # a reduced draft vocabulary (d2t not all zeros) that holds the continuation's tokens
    counts = torch.bincount(seq, minlength=target.vocab_size) * 100 + torch.randint(0, 50, (target.vocab_size,))
    torch.manual_seed(1)
    d = cls.from_target(cls.Config(block_size=4, num_layers=2, draft_vocab_size=100, num_anchors=64,
                                   sliding_window=window), target, counts)
    assert bool(d.d2t.any())
    fit = as_batch(target, d, seq[None])  # fit the target's own continuation a little: some drafts get accepted
    opt = torch.optim.Adam(d.trainable_parameters(), lr=1e-2)
    for _ in range(40):
        opt.zero_grad()
        d.forward_loss(fit).loss.backward()
        opt.step()
    d.eval()
    prop = Recording(d.make_proposer(target))
    gen = generate(target, prop, prompt, LoopConfig(k=5, max_new_tokens=40))
    assert gen.tokens == base.tokens  # lossless
    seq = torch.cat([prompt, torch.tensor(gen.tokens)])[None]  # [1, s]: the committed sequence
    batch = as_batch(target, d, seq)
    assert len(prop.rounds) >= 5 and any(r.accepted for r in gen.rounds)  # rollbacks AND acceptances happened
    with torch.no_grad():
        for length, drafted in prop.rounds:
            # the block is anchored at the newest committed token, position length - 1
            assert training_path_drafts(d, batch, length - 1, len(drafted)) == drafted, length
