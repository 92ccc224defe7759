"""P-EAGLE: COD sampling, the parallel loss against a hand-written per-element reference, the
proposer's one-forward logits equal the training forward's, lossless greedy decoding."""
from __future__ import annotations

import functools
import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith.data import features
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads.peagle import PEagleDrafter
from draftsmith.testing import tiny_target
from tests.helpers import batch_for as shared_batch_for


def make(num_depths=3, draft_vocab_size=100, seed=0, **options):
    target = tiny_target(num_layers=4, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    counts = torch.randint(0, 50, (target.vocab_size,))
    cfg = PEagleDrafter.Config(num_depths=num_depths, draft_vocab_size=draft_vocab_size, down_sample_ratio=0.6,
                               down_sample_ratio_min=0.3, **options)
    drafter = PEagleDrafter.from_target(cfg, target, counts)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, drafter


batch_for = functools.partial(shared_batch_for, mask_above=0.2)

def element_output(d, batch, row, a, depth):
    """Output of element (a, depth), written out: its query against the explicit list of elements it may
    see (real pairs <= a, then its own chain's depths 1..depth), one softmax."""
    layer, attn = d.midlayer, d.midlayer.self_attn
    ids = batch["input_ids"][row]
    hidden = d.fc(batch["aux_hidden_states"][row : row + 1])  # [1, s, h]

    def inputs(anchor, dep):
        if dep == 0:
            return ids[anchor + 1].view(1, 1), hidden[:, anchor : anchor + 1]
        return torch.tensor([[d.mask_token_id]]), d.fc(d.mask_hidden)

    def qkv(anchor, dep):
        tok, h = inputs(anchor, dep)
        x = torch.cat([layer.input_layernorm(d.embed_tokens(tok)), layer.hidden_norm(h)], -1)
        cos, sin = d.rotary(x, torch.tensor([[anchor + dep]]))
        q = attn.q_proj(x).view(1, 1, attn.num_heads, attn.head_dim).transpose(1, 2)
        k = attn.k_proj(x).view(1, 1, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        v = attn.v_proj(x).view(1, 1, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q[0, :, 0], k[0, :, 0], v[0, :, 0], h

    q, _, _, h = qkv(a, depth)
    W = d.cfg.sliding_window if d.cfg.sliding_window is not None else 10**9  # keys < W positions back
    visible = [qkv(j, 0) for j in range(a + 1) if a + depth - j < W] + \
        [qkv(a, e) for e in range(1, depth + 1) if depth - e < W]
    rep = attn.num_heads // attn.num_kv_heads
    heads = []
    for hd in range(attn.num_heads):
        scores = torch.stack([q[hd] @ kv[1][hd // rep] for kv in visible]) / math.sqrt(attn.head_dim)
        w = torch.softmax(scores, 0)
        heads.append(sum(w[i] * visible[i][2][hd // rep] for i in range(len(visible))))
    out = h + attn.o_proj(torch.cat(heads).view(1, 1, -1))
    out = out + layer.mlp(layer.post_attention_layernorm(out))
    return d.logits(out)[0, 0]


def test_cod_sampling_nests_and_shrinks():
    _, d = make(num_depths=4)
    valid = torch.ones(2, 20, dtype=torch.bool)
    valid[1, 10:] = False
    chains = d.cod_anchors(valid, torch.Generator().manual_seed(0))
    assert [int(ok[0].sum()) for _, ok in chains] == [12, 7, 6]  # 20 * max(0.6^d, 0.3)
    assert [int(ok[1].sum()) for _, ok in chains] == [6, 3, 3]
    for (prev, prev_ok), (cur, cur_ok) in zip(chains, chains[1:]):  # depth d's anchors come from depth d-1's
        for r in range(2):
            assert set(cur[r][cur_ok[r]].tolist()) <= set(prev[r][prev_ok[r]].tolist())
    assert all(bool(valid[1, a[1][ok[1]]].all()) for a, ok in chains)


@pytest.mark.parametrize("window", [None, 2])
def test_loss_matches_hand_written_reference(window):
    target, d = make(sliding_window=window)
    batch = batch_for(target, d)
    d.eval()  # fixed COD draw
    out = d.forward_loss(batch)
    s = batch["input_ids"].shape[1]
    m = (batch["loss_mask"] * batch["attention_mask"]).float()
    valid = torch.cat([m[:, 2:], m.new_zeros(2, 1)], 1).bool()  # pair a may anchor when x_{a+2} is a loss token
    chains = d.cod_anchors(valid, torch.Generator().manual_seed(0))
    draft_ids = d.draft_ids()
    total, count = 0.0, 0
    for row in range(2):
        elements = [(j, 0) for j in range(s - 1) if batch["attention_mask"][row, j + 1]]
        for depth, (anchors, ok) in enumerate(chains, start=1):
            elements += [(int(a), depth) for a, o in zip(anchors[row], ok[row]) if o]
        for a, depth in elements:
            t = a + depth + 2  # the predicted token's position
            if t >= s or m[row, t] == 0:
                continue
            logq = torch.log_softmax(element_output(d, batch, row, a, depth), -1)
            p = torch.softmax(batch["target_logits"][row, t - 1, draft_ids], -1)
            total = total + (p * (p.log() - logq)).sum()
            count += 1
    assert count == out.num_tokens > 0
    assert torch.allclose(out.loss, torch.as_tensor(total), rtol=1e-4, atol=1e-5), (out.loss, total)
    assert {"acc_0", "acc_1", "acc_2"} <= set(out.metrics)


@pytest.mark.parametrize("window", [None, 2])
def test_proposer_one_forward_equals_training_elements(window):
    target, d = make(num_depths=4, sliding_window=window)
    d.eval()
    ids = torch.randint(3, target.vocab_size, (1, 12), generator=torch.Generator().manual_seed(2))
    batch = features.complete(target, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                       "loss_mask": torch.ones_like(ids)}, set(d.required_features), d.feature_layers())
    n = 8  # context x_0..x_7: the newest pair is a = 6 = (h_6, x_7)
    with torch.no_grad():
        prop = d.make_proposer(target)
        prop.begin(ids[0, :n])
        out = target.forward(ids[:, : n - 1])
        prop.commit(ids[0, :n], n - 1, out)
        got = prop.parallel_logits(4)  # [4, dv]
        want = torch.stack([element_output(d, batch, 0, n - 2, depth) for depth in range(4)])
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert len(prop.cache) == n - 1  # placeholders never stay in the cache


@pytest.mark.parametrize("k", [1, 3, 6])
def test_greedy_parallel_drafting_is_lossless(k):
    target, d = make(num_depths=4)
    d.eval()
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(5))
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=24))
    spec = generate(target, d.make_proposer(target), prompt, LoopConfig(k=k, max_new_tokens=24))
    assert spec.tokens == base.tokens
    assert max(r.proposed for r in spec.rounds) == min(k, 4)


def test_trains_its_own_embedding_and_mask_hidden():
    target, d = make()
    names = {n for n, p in d.named_parameters() if p.requires_grad}
    assert {"embed_tokens.weight", "mask_hidden", "fc.weight"} <= names
    assert d.embed_tokens.weight.data_ptr() != target.embed_tokens.weight.data_ptr()
    with pytest.raises(ValueError, match="num_depths"):
        PEagleDrafter.from_target(PEagleDrafter.Config(num_depths=0), target)


def test_stochastic_parallel_proposal_carries_its_distributions():
    from draftsmith.core.sampling import SamplingParams

    target, d = make(num_depths=3)
    d.eval()
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(5))
    prop = d.make_proposer(target)
    prop.begin(prompt)
    prop.commit(prompt, 5, target.forward(prompt[None, :-1]))
    draft = prop.propose(prompt, 3, SamplingParams(temperature=0.7, top_p=0.9), torch.Generator().manual_seed(0))
    assert draft.tokens.shape == (3,) and torch.allclose(draft.probs.sum(-1), torch.ones(3))
    assert bool((draft.probs[torch.arange(3), draft.tokens] > 0).all()) and len(prop.cache) == 5
