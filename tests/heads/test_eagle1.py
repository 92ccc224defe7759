"""EAGLE-1: the regression + classification loss against a hand-written per-position reference,
noise only in training mode, the KV-cached proposer equal to the training pass (teacher-forced and
on its own feature chain), the debug recipe training, and lossless greedy decoding."""
from __future__ import annotations

import functools
import math

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from draftsmith import config
from draftsmith.core.sampling import SamplingParams, logits_to_probs
from draftsmith.heads.eagle1 import Eagle1Drafter
from draftsmith.targets.load import TargetOutput
from draftsmith.testing import tiny_target
from tests.conftest import REPO, STORIES, shared_path
from tests.helpers import batch_for as shared_batch_for


def make(seed=0, **options):
    target = tiny_target(num_layers=2, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    d = Eagle1Drafter.from_target(Eagle1Drafter.Config(**options), target)
    with torch.no_grad():
        for p in d.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, d


batch_for = functools.partial(shared_batch_for, drafter=None, s=10, required={"last_hidden_state", "target_logits"})

def reference_loss(d, batch):
    """Per row and position with explicit key lists: pair (f_j, x_{j+1}) predicts f_{j+1}."""
    layer, attn = d.layers[0], d.layers[0].self_attn
    ids, feats = batch["input_ids"], batch["last_hidden_state"]
    mask = batch["loss_mask"] * batch["attention_mask"]
    b, s = ids.shape
    total = 0.0
    for row in range(b):
        keys = []
        for j in range(s - 1):
            x = d.fc(torch.cat([d.embed_tokens[0].weight[ids[row, j + 1]], feats[row, j]]).view(1, 1, -1))
            cos, sin = d.rotary(x, torch.tensor([[j]]))
            q = attn.q_proj(x).view(1, 1, attn.num_heads, attn.head_dim).transpose(1, 2)
            k = attn.k_proj(x).view(1, 1, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
            v = attn.v_proj(x).view(1, 1, attn.num_kv_heads, attn.head_dim).transpose(1, 2)
            q, k = apply_rotary_pos_emb(q, k, cos, sin)
            keys.append((k[0, :, 0], v[0, :, 0]))
            heads = []
            for hh in range(attn.num_heads):
                kv = hh // (attn.num_heads // attn.num_kv_heads)
                scores = torch.stack([q[0, hh, 0] @ kk[kv] for kk, _ in keys]) / math.sqrt(attn.head_dim)
                w = torch.softmax(scores, 0)
                heads.append(sum(wi * vv[kv] for wi, (_, vv) in zip(w, keys)))
            h1 = x + attn.o_proj(torch.cat(heads).view(1, 1, -1))
            pred = (h1 + layer.mlp(layer.post_attention_layernorm(h1)))[0, 0]
            if j + 2 >= s or not mask[row, j + 2]:
                continue
            diff = (pred - feats[row, j + 1]).abs()
            reg = torch.where(diff < 1, 0.5 * diff**2, diff - 0.5).mean()
            p = torch.softmax(batch["target_logits"][row, j + 1], -1)
            logq = torch.log_softmax(d.lm_head[0].weight @ pred, -1)
            kl = (p * (p.log() - logq)).sum()
            total += d.cfg.regression_weight * float(reg) + d.cfg.classification_weight * float(kl)
    return total


def test_loss_matches_hand_written_reference():
    target, d = make(regression_weight=1.0, classification_weight=0.3)
    batch = batch_for(target)
    d.eval()
    with torch.no_grad():
        got = d.forward_loss(batch)
        want = reference_loss(d, batch)
    assert got.loss.item() == pytest.approx(want, rel=1e-4)
    assert got.num_tokens == int((batch["loss_mask"] * batch["attention_mask"])[:, 2:].sum())
    assert {"acc_0", "loss_reg", "loss_cls"} <= set(got.metrics)
    assert set(d.state_dict()) >= {"fc.weight", "fc.bias", "layers.0.self_attn.q_proj.weight"}
    assert not any(k.startswith(("embed_tokens", "lm_head")) for k in d.state_dict())  # shared, frozen, not saved


def test_noise_only_in_training_mode():
    target, d = make(noise_range=0.5)
    batch = batch_for(target)
    with torch.no_grad():
        d.eval()
        clean = d.forward_loss(batch).loss
        assert torch.equal(clean, d.forward_loss(batch).loss)
        d.train()
        assert not torch.equal(clean, d.forward_loss(batch).loss)
        d.cfg.noise_range = 0.0
        torch.testing.assert_close(d.forward_loss(batch).loss, clean)


def test_loss_is_differentiable_and_target_untouched():
    target, d = make()
    before = {k: v.clone() for k, v in target.model.state_dict().items()}
    d.forward_loss(batch_for(target)).loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in d.trainable_parameters())
    assert all(p.grad is None for p in target.model.parameters())
    assert all(torch.equal(before[k], v) for k, v in target.model.state_dict().items())


def test_proposer_equals_training_pass():
    """Draft 1 equals training's (teacher-forced) prediction at the last committed pair; the
    cached chain equals one uncached causal pass over the pairs with the drafter's own features."""
    target, d = make()
    d.eval()
    ctx = torch.randint(3, target.vocab_size, (9,), generator=torch.Generator().manual_seed(5))
    sampling = SamplingParams(temperature=0.9)
    out = target.forward(ctx[None, :-1])
    proposer = d.make_proposer(target)
    proposer.begin(ctx[:-1])
    proposer.commit(ctx[:5], 4, TargetOutput(out.logits[:, :4], tuple(h[:, :4] for h in out.hidden_states)))
    proposer.propose(ctx[:5], 3, sampling, torch.Generator().manual_seed(1))  # a speculative chain to roll back
    proposer.commit(ctx, 4, TargetOutput(out.logits[:, 4:], tuple(h[:, 4:] for h in out.hidden_states)))
    draft = proposer.propose(ctx, 3, sampling, torch.Generator().manual_seed(0))
    n = ctx.shape[0] - 1
    feats = out.hidden_states[-1]  # [1, n, h] f_0..f_{n-1}
    with torch.no_grad():
        pos = torch.arange(n).view(1, -1)
        teacher = d.step(ctx[None, 1:], feats, pos)  # the training pass (no noise in eval mode)
        torch.testing.assert_close(draft.probs[0], logits_to_probs(d.logits(teacher)[0, -1], sampling))
        # the chain: pairs (f̂_n, d1), (f̂_{n+1}, d2) appended, f̂ the drafter's own predictions
        toks, fs = ctx[None, 1:], feats
        for i in range(1, 3):
            pred = d.step(toks, fs, torch.arange(toks.shape[1]).view(1, -1))
            toks = torch.cat([toks, draft.tokens[i - 1].view(1, 1)], 1)
            fs = torch.cat([fs, pred[:, -1:]], 1)
        pred = d.step(toks, fs, torch.arange(toks.shape[1]).view(1, -1))
        for i in range(3):
            want = logits_to_probs(d.logits(pred)[0, n - 1 + i], sampling)
            torch.testing.assert_close(draft.probs[i], want, rtol=1e-4, atol=1e-5)


def test_debug_recipe_trains(tmp_path, stories_target):
    from draftsmith.train.loop import Trainer

    cfg = config.load(REPO / "recipes/debug/eagle1-stories260k.yaml", [
        f"target.path={shared_path(STORIES)}", f"data.path=[{shared_path('data/alpaca/alpaca_en_demo.json')}]",
        f"regenerate.output={tmp_path / 'regen.jsonl'}", "regenerate.limit=16", "regenerate.max_new_tokens=32",
        "data.eval_samples=4", "train.max_steps=3", "train.batch_size=4", "train.eval_every=0",
        f"train.output_dir={tmp_path / 'run'}", "logging.progress_bar=false"])
    before = {k: v.clone() for k, v in stories_target.model.state_dict().items()}
    trainer = Trainer(cfg, stories_target)
    init = {k: v.clone() for k, v in trainer.drafter.state_dict().items() if "inv_freq" not in k}
    result = trainer.run()
    assert result.steps == 3 and all(math.isfinite(x) for x in result.losses)
    state = trainer.drafter.state_dict()
    assert all(not torch.equal(init[k], state[k]) for k in init)
    assert all(torch.equal(before[k], v) for k, v in stories_target.model.state_dict().items())
    assert (result.final_checkpoint / "drafter.safetensors").exists()


