"""DFlash: the block loss against a hand-written per-anchor, per-slot reference; the proposer's
block logits equal the training forward's; lossless greedy decoding through the one loop."""
from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith.core.sampling import SamplingParams
from draftsmith.data import features
from draftsmith.eval.loop import LoopConfig, generate, slice_output
from draftsmith.heads.dflash import DFlashDrafter
from draftsmith.testing import tiny_target
from tests.helpers import batch_for


def make(block_size=4, num_layers=2, draft_vocab_size=100, num_anchors=4, seed=0, **options):
    target = tiny_target(num_layers=4, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    counts = torch.randint(0, 50, (target.vocab_size,))
    cfg = DFlashDrafter.Config(block_size=block_size, num_layers=num_layers, draft_vocab_size=draft_vocab_size,
                               num_anchors=num_anchors, loss_decay_gamma=2.0, **options)
    drafter = DFlashDrafter.from_target(cfg, target, counts)
    with torch.no_grad():  # move away from the init so the reference is not trivially symmetric
        for p in drafter.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, drafter



def reference_block(d, batch, row, p):
    """One block anchored at p, written out -> [B, dv] backbone logits."""
    return d.lm_head(reference_hidden(d, batch, row, p))


def reference_hidden(d, batch, row, p):
    """One block anchored at p, written out: context features of positions < p (with drafter.sliding_window
    W only positions p - W .. p - 1), explicit key lists, one softmax per query over [context keys, the
    block's keys]. -> [B, h] after the final norm."""
    B = d.block_size
    ids = batch["input_ids"][row]
    start = 0 if d.cfg.sliding_window is None else max(0, p - d.cfg.sliding_window)
    ctx = d.hidden_norm(d.fc(batch["aux_hidden_states"][row : row + 1, start:p]))  # [1, c, h]
    x = d.embed_tokens[0](torch.tensor([[int(ids[p])] + [d.mask_token_id] * (B - 1)]))  # [1, B, h]
    pos_ctx, pos_blk = torch.arange(start, p).view(1, -1), torch.arange(p, p + B).view(1, -1)
    for layer in d.layers:
        a = layer.self_attn
        xn = layer.input_layernorm(x)

        def heads(t, n, a=a):
            return t.view(1, t.shape[1], n, a.head_dim).transpose(1, 2)

        cos_c, sin_c = d.rotary(ctx, pos_ctx)
        cos_b, sin_b = d.rotary(xn, pos_blk)
        q = a.q_norm(heads(a.q_proj(xn), a.num_heads))  # RMSNorm over head_dim
        q, _ = apply_rotary_pos_emb(q, q, cos_b, sin_b)
        kc = a.k_norm(heads(a.k_proj(ctx), a.num_kv_heads))
        kb = a.k_norm(heads(a.k_proj(xn), a.num_kv_heads))
        kc, _ = apply_rotary_pos_emb(kc, kc, cos_c, sin_c)
        kb, _ = apply_rotary_pos_emb(kb, kb, cos_b, sin_b)
        keys = torch.cat([kc, kb], 2)[0]  # [KV, p + B, d]
        values = torch.cat([heads(a.v_proj(ctx), a.num_kv_heads), heads(a.v_proj(xn), a.num_kv_heads)], 2)[0]
        rep = a.num_heads // a.num_kv_heads
        outs = []
        for i in range(B):
            per_head = []
            for hd in range(a.num_heads):
                n_keys = keys.shape[1]
                scores = torch.stack([q[0, hd, i] @ keys[hd // rep, j] for j in range(n_keys)]) / math.sqrt(a.head_dim)
                w = torch.softmax(scores, 0)
                per_head.append(sum(w[j] * values[hd // rep, j] for j in range(n_keys)))
            outs.append(torch.cat(per_head))
        x = x + a.o_proj(torch.stack(outs)[None])
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    return d.norm(x)[0]


@pytest.mark.parametrize("window", [None, 1, 3])
def test_loss_matches_hand_written_reference(window):
    target, d = make(sliding_window=window, loss="kl")  # the forward KL written out below (the default is D-PACE)
    batch = batch_for(target, d)
    d.eval()  # fixed anchors (the held-out generator), same as the reference will read back
    out = d.forward_loss(batch)
    anchors, ok = d.anchors_for(batch)
    mask = (batch["loss_mask"] * batch["attention_mask"]).float()
    draft_ids = d.draft_ids()
    total, count = 0.0, 0
    for row in range(anchors.shape[0]):
        for a in range(anchors.shape[1]):
            if not ok[row, a]:
                continue
            p = int(anchors[row, a])
            logq = torch.log_softmax(reference_block(d, batch, row, p), -1)
            for i in range(1, d.block_size):
                if p + i >= batch["input_ids"].shape[1] or mask[row, p + i] == 0:
                    continue
                target_p = torch.softmax(batch["target_logits"][row, p + i - 1, draft_ids], -1)
                kl = (target_p * (target_p.log() - logq[i])).sum()
                total = total + math.exp(-(i - 1) / d.cfg.loss_decay_gamma) * kl
                count += 1
    assert count == out.num_tokens > 0
    assert torch.allclose(out.loss, torch.as_tensor(total), rtol=1e-4, atol=1e-5), (out.loss, total)
    assert set(out.metrics) >= {"acc_0", "acc_1", "acc_2", "loss_0"}


def test_anchors_are_valid_and_many_per_sequence():
    target, d = make(num_anchors=3)
    batch = batch_for(target, d, s=16)
    anchors, ok = d.anchors_for(batch)
    valid = d.valid_anchors(batch)
    assert anchors.shape == (2, 3) and bool(ok.all())
    assert all(bool(valid[r, anchors[r][ok[r]]].all()) for r in range(2))
    assert all(len(set(anchors[r].tolist())) == 3 for r in range(2))


@pytest.mark.parametrize("window", [None, 2])
def test_proposer_logits_equal_training_forward(window):
    target, d = make(sliding_window=window)
    d.eval()
    ids = torch.randint(3, target.vocab_size, (1, 14), generator=torch.Generator().manual_seed(3))
    batch = features.complete(target, {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask":
                                       torch.ones_like(ids)}, set(d.required_features), d.feature_layers())
    n = 9  # committed context x_0..x_8: the block is anchored at position 8
    with torch.no_grad():
        train_logits = d.block_logits(batch, torch.tensor([[n - 1]]))[0, 0]  # [B, dv]
        prop = d.make_proposer(target)
        prop.begin(ids[0, :n])
        out = target.forward(ids[:, : n - 1])  # target states of x_0..x_7, committed in two pieces
        prop.commit(ids[0, :5], 4, slice_output(out, 4))
        rest = type(out)(out.logits[:, 4:], tuple(h[:, 4:] for h in out.hidden_states))
        prop.commit(ids[0, :n], n - 5, rest)
        infer_logits = prop.block_logits(ids[0, :n])
    assert torch.allclose(train_logits, infer_logits, atol=1e-5), (train_logits - infer_logits).abs().max()


@pytest.mark.parametrize("k", [2, 7])
def test_greedy_block_drafting_is_lossless(k):
    target, d = make(block_size=4)
    d.eval()
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(5))
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=24))
    spec = generate(target, d.make_proposer(target), prompt, LoopConfig(k=k, max_new_tokens=24))
    assert spec.tokens == base.tokens
    assert max(r.proposed for r in spec.rounds) == min(k, d.block_size - 1)  # one block: at most B - 1 drafts


def test_stochastic_block_proposal_carries_its_distributions():
    target, d = make()
    d.eval()
    prop = d.make_proposer(target)
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(5))
    prop.begin(prompt)
    prop.commit(prompt, 5, features_out(target, prompt[:-1]))
    g = torch.Generator().manual_seed(0)
    draft = prop.propose(prompt, 3, SamplingParams(temperature=0.8, top_k=20), g)
    assert draft.tokens.shape == (3,) and draft.probs.shape == (3, target.vocab_size)
    assert torch.allclose(draft.probs.sum(-1), torch.ones(3))
    assert bool((draft.probs[torch.arange(3), draft.tokens] > 0).all())
    assert bool((draft.probs[:, ~d.t2d] == 0).all())  # nothing outside the draft vocabulary


def features_out(target, ids):
    return target.forward(ids[None])


def test_frozen_embedding_and_head_by_default_and_bad_options():
    target, d = make()
    assert not d.lm_head.weight.requires_grad and all(not k.startswith("embed") for k in d.state_dict())
    with pytest.raises(ValueError, match="block_size"):
        DFlashDrafter.from_target(DFlashDrafter.Config(block_size=1), target)
    with pytest.raises(ValueError, match="mask_token_id"):
        DFlashDrafter.from_target(DFlashDrafter.Config(mask_token_id=10_000), target)
