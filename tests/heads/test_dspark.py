"""DSpark: the loss (Markov-biased KL + confidence BCE) against a hand-written reference built on the
DFlash reference block; proposer logits equal the training forward's on the same previous tokens;
the confidence head sets a per-round verify length; lossless greedy decoding."""
from __future__ import annotations

import math

import pytest
import torch
from test_dflash import batch_for, reference_hidden

from draftsmith.core.sampling import SamplingParams
from draftsmith.data import features
from draftsmith.eval import metrics
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads.dspark import DSparkDrafter
from draftsmith.testing import tiny_target


def make(block_size=4, threshold=0.3, seed=0, **options):
    target = tiny_target(num_layers=4, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    counts = torch.randint(0, 50, (target.vocab_size,))
    cfg = DSparkDrafter.Config(block_size=block_size, num_layers=2, draft_vocab_size=100, num_anchors=4,
                               loss_decay_gamma=2.0, markov_rank=8, confidence_weight=0.5,
                               confidence_threshold=threshold, **options)
    drafter = DSparkDrafter.from_target(cfg, target, counts)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, drafter


def test_loss_matches_hand_written_reference():
    target, d = make(loss="kl")  # the forward KL written out below (the default is D-PACE: test_dpace.py)
    batch = batch_for(target, d)
    d.eval()
    out = d.forward_loss(batch)
    anchors, ok = d.anchors_for(batch)
    ids, s = batch["input_ids"], batch["input_ids"].shape[1]
    mask = (batch["loss_mask"] * batch["attention_mask"]).float()
    draft_ids = d.draft_ids()
    total, count = 0.0, 0
    for row in range(anchors.shape[0]):
        for a in range(anchors.shape[1]):
            if not ok[row, a]:
                continue
            p = int(anchors[row, a])
            hidden = reference_hidden(d, batch, row, p)  # [B, h]
            for i in range(d.block_size):
                t = p + i + 1  # slot i predicts x_{p+i+1}; its previous token is x_{p+i}
                if t >= s or mask[row, t] == 0:
                    continue
                e = d.markov_head.markov_w1.weight[ids[row, p + i]]
                logq = torch.log_softmax(d.lm_head(hidden[i]) + d.markov_head.markov_w2.weight @ e, -1)
                target_p = torch.softmax(batch["target_logits"][row, t - 1, draft_ids], -1)
                kl = (target_p * (target_p.log() - logq)).sum()
                c = torch.sigmoid(d.confidence_head.proj.weight[0] @ torch.cat([hidden[i], e]) + d.confidence_head.proj.bias[0])
                accept = sum(min(float(a_), float(b_)) for a_, b_ in zip(target_p, logq.detach().exp()))
                bce = -(accept * torch.log(c) + (1 - accept) * torch.log(1 - c))
                total = total + math.exp(-i / d.cfg.loss_decay_gamma) * (kl + 0.5 * bce)
                count += 1
    assert count == out.num_tokens > 0
    assert torch.allclose(out.loss, torch.as_tensor(total).float(), rtol=1e-4, atol=1e-5), (out.loss, total)
    assert {"acc_0", "acc_3", "confidence_abs_error", "accept_rate"} <= set(out.metrics)


def committed_proposer(target, d, ids, n):
    prop = d.make_proposer(target)
    prop.begin(ids[0, :n])
    prop.commit(ids[0, :n], n - 1, target.forward(ids[:, : n - 1]))
    return prop


def test_proposer_chain_equals_training_forward_on_the_same_tokens():
    target, d = make(threshold=0.0)
    d.eval()
    ids = torch.randint(3, target.vocab_size, (1, 14), generator=torch.Generator().manual_seed(3))
    n = 9
    with torch.no_grad():
        prop = committed_proposer(target, d, ids, n)
        draft = prop.propose(ids[0, :n], 4, SamplingParams(), None)  # greedy chain of 4
        # training forward on a sequence whose block tokens are those drafts (teacher forcing = the chain)
        seq = torch.cat([ids[:, :n], draft.tokens.view(1, -1)], dim=1)
        batch = features.complete(target, {"input_ids": seq, "attention_mask": torch.ones_like(seq),
                                           "loss_mask": torch.ones_like(seq)}, set(d.required_features),
                                  d.feature_layers())
        hidden = d.blocks_hidden(batch, torch.tensor([[n - 1]]))[0, 0]  # [B, h]
        prev = seq[0, n - 1 : n - 1 + d.block_size]
        logits, _ = d.heads(hidden, prev)
    full = torch.full((4, target.vocab_size), float("-inf"))
    full[:, d.draft_ids()] = logits
    assert torch.equal(draft.tokens, full.argmax(-1))  # each draft = argmax given the previous draft
    assert torch.allclose(hidden, prop.block_hidden(ids[0, :n]), atol=1e-5)


def test_confidence_head_sets_the_verify_length():
    target, d = make(block_size=6, threshold=0.5)
    d.eval()
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        for bias, want in ((10.0, 6), (-10.0, 1)):  # confident: the whole block; not: one token
            d.confidence_head.proj.bias.fill_(bias)
            prop = committed_proposer(target, d, ids, 8)
            assert prop.propose(ids[0, :8], 6, SamplingParams(), None).tokens.shape == (want,)
        d.confidence_head.proj.bias.fill_(0.0)
        d.confidence_head.proj.weight.zero_()  # c = 0.5 each: the product drops below 0.5 after 2 slots
        prop = committed_proposer(target, d, ids, 8)
        assert prop.propose(ids[0, :8], 6, SamplingParams(), None).tokens.shape == (2,)


@pytest.mark.parametrize("threshold", [0.0, 0.6])
def test_greedy_is_lossless_and_results_carry_verify_lengths(threshold):
    target, d = make(block_size=4, threshold=threshold)
    d.eval()
    prop = d.make_proposer(target)
    sent = []
    inner = prop.propose
    prop.propose = lambda *a, **kw: sent.append(len((draft := inner(*a, **kw)).tokens)) or draft  # noqa: E731
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(5))
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=24))
    spec = generate(target, prop, prompt, LoopConfig(k=4, max_new_tokens=24))
    assert spec.tokens == base.tokens
    assert [r.proposed for r in spec.rounds if r.proposed] == sent  # the round log is the head's choice
    verify_lengths = metrics.request_metrics(spec, base, 4)["verify_lengths"]  # what results JSON carries
    assert [n for n in verify_lengths if n] == sent


def test_stochastic_chain_probs():
    target, d = make(threshold=0.0)
    d.eval()
    ids = torch.randint(3, target.vocab_size, (1, 10), generator=torch.Generator().manual_seed(4))
    prop = committed_proposer(target, d, ids, 8)
    draft = prop.propose(ids[0, :8], 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert draft.probs.shape == (4, target.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(4))
    assert bool((draft.probs[torch.arange(4), draft.tokens] > 0).all())
