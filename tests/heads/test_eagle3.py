"""EAGLE-3: the TTT loss against a hand-written per-position reference; Eagle3Proposer's drafts
equal the training unroll; propose -> commit -> propose rolls the speculative chain back."""
from __future__ import annotations

import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith.core.sampling import SamplingParams
from draftsmith.data import features
from draftsmith.heads.eagle3 import Eagle3Drafter
from draftsmith.targets.load import TargetOutput
from draftsmith.testing import tiny_target
from tests.helpers import batch_for


def make(ttt_steps=3, draft_vocab_size=None, seed=0, **options):
    target = tiny_target(num_layers=4, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    counts = torch.randint(0, 50, (target.vocab_size,))
    cfg = Eagle3Drafter.Config(ttt_steps=ttt_steps, draft_vocab_size=draft_vocab_size, **options)
    drafter = Eagle3Drafter.from_target(cfg, target, counts)
    with torch.no_grad():  # move the drafter away from its init so the test is not trivially symmetric
        for p in drafter.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, drafter



def reference_loss(drafter, batch):
    """Per position and per step, with explicit key lists (no masks, no batching tricks), for every
    option: norm_before_residual, fc_norm, norm_output, hard_label_weight, mask_out_of_vocab."""
    d, layer, c = drafter, drafter.midlayer, drafter.cfg
    attn = layer.self_attn
    ids, b, s = batch["input_ids"], *batch["input_ids"].shape
    mask = (batch["loss_mask"] * batch["attention_mask"]).float()
    draft_list = d.draft_ids().tolist()
    p_all = torch.softmax(batch["target_logits"].float()[..., d.draft_ids()], -1)
    total = 0.0
    for row in range(b):
        aux = batch["aux_hidden_states"][row : row + 1]
        if c.fc_norm:
            h = aux.shape[-1] // len(d.aux_layer_ids)
            aux = torch.cat([d.fc_norm[i](aux[..., i * h : (i + 1) * h]) for i in range(len(d.aux_layer_ids))], -1)
        hidden = d.fc(aux)  # [1, s, h]
        keys = {}  # (step, position) -> (k, v) each [KV, hd]
        for t in range(d.cfg.ttt_steps):
            n = s - 1 - t
            outs = []
            for j in range(n):
                emb = d.embed_tokens[0](ids[row, 1 + t + j].view(1, 1))
                x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden[:, j : j + 1])], -1)
                cos, sin = d.rotary(x, torch.tensor([[j + t]]))
                q = attn.q_proj(x).view(1, 1, attn.num_heads, attn.head_dim).transpose(1, 2)
                k = attn.k_proj(x).view(1, 1, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
                v = attn.v_proj(x).view(1, 1, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
                q, k = apply_rotary_pos_emb(q, k, cos, sin)
                keys[(t, j)] = (k[0, :, 0], v[0, :, 0])
                # step t at index j sits at position j + t; key (0, i) at i, key (u, j) at j + u
                W = c.sliding_window if c.sliding_window is not None else 10**9
                visible = [keys[(0, i)] for i in range(j + 1) if (j + t) - i < W] + \
                    [keys[(u, j)] for u in range(1, t + 1) if t - u < W]
                heads = []
                for hh in range(attn.num_heads):
                    kv = hh // (attn.num_heads // attn.num_kv_heads)
                    scores = torch.stack([q[0, hh, 0] @ kk[kv] for kk, _ in visible]) / math.sqrt(attn.head_dim)
                    w = torch.softmax(scores, 0)
                    heads.append(sum(wi * vv[kv] for wi, (_, vv) in zip(w, visible)))
                o = attn.o_proj(torch.cat(heads).view(1, 1, -1))
                residual = layer.hidden_norm(hidden[:, j : j + 1]) if c.norm_before_residual else hidden[:, j : j + 1]
                h1 = residual + o
                h2 = h1 + layer.mlp(layer.post_attention_layernorm(h1))
                outs.append(d.norm(h2) if c.norm_output else h2)
            hidden = torch.cat(outs, 1)
            normed = hidden if c.norm_output else d.norm(hidden)
            logq = torch.log_softmax(d.lm_head(normed).float(), -1)[0]  # [n, dv]
            for j in range(n):
                label = 1 + t + j  # the target's distribution for the token this position predicts
                top = int(batch["target_logits"][row, label].argmax())
                if label + 1 >= s:  # no token past the end
                    continue
                if mask[row, label + 1] == 0 or (c.mask_out_of_vocab and top not in draft_list):
                    continue
                p = p_all[row, label]
                kl = float((p * (p.clamp_min(1e-20).log() - logq[j])).sum())
                ce = -float(logq[j, draft_list.index(top)]) if top in draft_list else 0.0
                w = c.hard_label_weight
                total += (c.step_decay**t) * ((1 - w) * kl + w * ce)
    return total


@pytest.mark.parametrize("draft_vocab_size", [None, 100])
def test_ttt_loss_matches_hand_written_reference(draft_vocab_size):
    target, drafter = make(ttt_steps=3, draft_vocab_size=draft_vocab_size)
    batch = batch_for(target, drafter)
    with torch.no_grad():
        got = drafter.forward_loss(batch)
        want = reference_loss(drafter, batch)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.num_tokens == int((batch["loss_mask"] * batch["attention_mask"])[:, 2:].sum())
    assert set(got.metrics) >= {"acc_0", "acc_1", "acc_2"}


OPTION_CASES = [
    {"norm_before_residual": True},
    {"fc_norm": True},
    {"norm_output": True},
    {"hard_label_weight": 1.0, "draft_vocab_size": 100},
    {"hard_label_weight": 0.3, "draft_vocab_size": 100, "mask_out_of_vocab": True},
    {"mask_out_of_vocab": True, "draft_vocab_size": 100, "step_decay": 0.7},
    {"norm_before_residual": True, "fc_norm": True, "norm_output": True, "init_std": 0.02},
    {"sliding_window": 1},
    {"sliding_window": 3},
    {"sliding_window": 2, "num_heads": 4, "num_kv_heads": 2, "head_dim": 16},
    {"num_heads": 8, "num_kv_heads": 2, "head_dim": 32, "intermediate_size": 96},
]


@pytest.mark.parametrize("options", OPTION_CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()))
def test_options_loss_matches_hand_written_reference(options):
    """Each EAGLE-3 option changes the loss exactly as the per-position reference says."""
    options = dict(options)
    target, drafter = make(ttt_steps=3, draft_vocab_size=options.pop("draft_vocab_size", None), **options)
    batch = batch_for(target, drafter)
    with torch.no_grad():
        if drafter.cfg.fc_norm:  # non-trivial norm weights, so fc_norm is not the identity scale
            for norm in drafter.fc_norm:
                norm.weight.mul_(torch.linspace(0.5, 1.5, norm.weight.numel()))
        got = drafter.forward_loss(batch)
        want = reference_loss(drafter, batch)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("chunk", [1, 4, 7])
def test_chunked_loss_equals_the_reference_with_the_same_gradients(chunk):
    """loss_chunk splits each TTT step's loss into position chunks whose logits are recomputed in
    backward: the loss equals the hand-written reference, and loss, gradients and metrics equal the
    whole-sequence path (loss_chunk: null), for the soft/hard label mix with out-of-vocabulary argmaxes."""
    options = {"hard_label_weight": 0.5, "mask_out_of_vocab": True, "draft_vocab_size": 100}
    runs = {}
    for name, loss_chunk in (("whole", None), ("chunked", chunk)):
        target, drafter = make(ttt_steps=3, loss_chunk=loss_chunk, **options)
        batch = batch_for(target, drafter, s=13)
        out = drafter.forward_loss(batch)
        out.loss.backward()
        runs[name] = (out, {n: p.grad.clone() for n, p in drafter.named_parameters() if p.grad is not None})
        with torch.no_grad():
            want = reference_loss(drafter, batch)
        assert out.loss.item() == pytest.approx(want, rel=1e-4), name
    (whole, whole_grads), (chunked, chunked_grads) = runs["whole"], runs["chunked"]
    torch.testing.assert_close(chunked.loss, whole.loss, rtol=1e-5, atol=1e-6)
    assert whole_grads.keys() == chunked_grads.keys() and whole_grads
    for name, grad in whole_grads.items():
        torch.testing.assert_close(chunked_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)
    assert chunked.metrics == pytest.approx(whole.metrics, rel=1e-5) and chunked.num_tokens == whole.num_tokens


def test_mask_out_of_vocab_drops_exactly_those_positions():
    target, drafter = make(ttt_steps=1, draft_vocab_size=100, mask_out_of_vocab=True)
    batch = batch_for(target, drafter)
    top = batch["target_logits"].argmax(-1)  # [b, s]
    m = (batch["loss_mask"] * batch["attention_mask"]).clone()
    m[:, 1:] *= drafter.t2d[top[:, :-1]].long()  # token j + 1 is predicted from the label at j
    assert drafter.forward_loss(batch).num_tokens == int(m[:, 2:].sum())
    assert int(m[:, 2:].sum()) < int((batch["loss_mask"] * batch["attention_mask"])[:, 2:].sum())


def test_frozen_lm_head_keeps_the_target_rows():
    target, drafter = make(ttt_steps=2, draft_vocab_size=100, freeze_lm_head=True)
    assert not drafter.lm_head.weight.requires_grad
    assert all(p is not drafter.lm_head.weight for p in drafter.trainable_parameters())


def test_option_ranges_are_reported():
    cfg = Eagle3Drafter.Config(ttt_steps=0, step_decay=1.5, hard_label_weight=2.0, lm_head_init="random",
                               freeze_lm_head=True)
    text = "\n".join(cfg.problems())
    assert "drafter.loss_chunk" in "\n".join(Eagle3Drafter.Config(loss_chunk=0).problems())
    for key in ("ttt_steps", "step_decay", "hard_label_weight", "freeze_lm_head"):
        assert f"drafter.{key}" in text


def test_loss_is_differentiable_and_target_untouched():
    target, drafter = make(ttt_steps=2)
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    out = drafter.forward_loss(batch_for(target, drafter))
    out.loss.backward()
    grads = [p.grad for p in drafter.trainable_parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().sum()) > 0 for g in grads)
    assert all(p.grad is None for p in target.model.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.model.state_dict().items())


def _features(target, drafter, ids):
    return features.complete(target, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                      "loss_mask": torch.ones_like(ids)}, set(drafter.required_features),
                             drafter.feature_layers())


def _begin(proposer, target, context, n_prompt):
    """The loop's prefill: begin(prompt), then commit the prompt's target states (n_prompt positions)."""
    proposer.begin(context[:n_prompt])
    out = target.forward(context[None, :n_prompt])
    proposer.commit(context, n_prompt, TargetOutput(out.logits, out.hidden_states))


def _commit_round(proposer, target, context, num_new):
    """The loop's commit after verification: the target's states at the num_new newest positions."""
    out = target.forward(context[None, :-1])
    proposer.commit(context, num_new, TargetOutput(out.logits[:, -num_new:],
                                                   tuple(h[:, -num_new:] for h in out.hidden_states)))


@pytest.mark.parametrize("draft_vocab_size,window", [(None, None), (100, None), (None, 2), (100, 4)])
def test_proposer_equals_training_unroll(draft_vocab_size, window):
    """Eagle3Proposer.propose (KV cache, its own positions) gives the TTT unroll's distributions when
    the unroll is fed the tokens the proposer drafted (with a sliding window too: the same keys)."""
    target, drafter = make(ttt_steps=3, draft_vocab_size=draft_vocab_size, sliding_window=window)
    prompt = torch.randint(3, target.vocab_size, (7,), generator=torch.Generator().manual_seed(3))  # [n]
    j = prompt.shape[0] - 1  # the chain starts after real pairs 0..j
    params = SamplingParams(temperature=1.0)
    with torch.no_grad():
        first = target.forward(prompt[None]).logits[0, -1].argmax().view(1)
        context = torch.cat([prompt, first])  # [n + 1]
        proposer = drafter.make_proposer(target)
        _begin(proposer, target, context, prompt.shape[0])
        draft = proposer.propose(context, 3, params, torch.Generator().manual_seed(0))
        # training path on context + the first two drafts: step t at position j reads token j + 1 + t
        ids = torch.cat([context, draft.tokens[:2]])[None]  # [1, n + 3]
        batch = _features(target, drafter, ids)
        hidden, step_kv, train_q = drafter.fc(batch["aux_hidden_states"]), [], []
        s = ids.shape[1]
        for t in range(3):
            n = s - 1 - t
            pos = (torch.arange(n) + t).view(1, -1)
            hidden = drafter.step(ids[:, 1 + t: 1 + t + n], hidden[:, :n], pos, step_kv=step_kv)
            logits = drafter.logits(hidden)[0, j]  # [dv]
            train_q.append(proposer._target_probs(logits, params))
    for t in range(3):
        torch.testing.assert_close(draft.probs[t], train_q[t], rtol=1e-4, atol=1e-6)


def test_propose_commit_propose_rolls_back_the_speculative_chain():
    """After a round with one accepted draft and a correction, the next proposal equals that of a
    proposer that never drafted the rejected tokens (the cache was cropped on commit)."""
    target, drafter = make(ttt_steps=3)
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(5))  # [n]
    greedy = SamplingParams()
    with torch.no_grad():
        context = torch.cat([prompt, torch.tensor([7])])  # prompt + the prefill's first token
        used = drafter.make_proposer(target)
        _begin(used, target, context, prompt.shape[0])
        first = used.propose(context, 3, greedy)  # three chain steps land in the cache
        assert len(used.cache) == used.committed + 2
        correction = (int(first.tokens[1]) + 1) % target.vocab_size  # d2 rejected: a different token
        context = torch.cat([context, first.tokens[:1], torch.tensor([correction])])  # d1 + correction
        _commit_round(used, target, context, 2)
        assert used.committed == context.shape[0] - 1 == len(used.cache)
        again = used.propose(context, 3, greedy)

        fresh = drafter.make_proposer(target)  # never drafted: prefill, then the same commit
        _begin(fresh, target, context[:prompt.shape[0] + 1], prompt.shape[0])
        _commit_round(fresh, target, context, 2)
        want = fresh.propose(context, 3, greedy)
    assert again.tokens.tolist() == want.tokens.tolist()
    torch.testing.assert_close(again.probs, want.probs, rtol=1e-5, atol=1e-6)
