"""DFlash 2: the dynamic convolution, the pairwise selector and the loss against hand-written references
on small tensors; a fresh drafter computes DFlash's backbone exactly (identity convolutions); the proposer
walks the selector over the unary top-K and reports q over those K; lossless greedy decoding; the engines'
formats refuse the kind in one line naming their PR."""
from __future__ import annotations

import math

import pytest
import torch
from test_dpace import loop_weights

from draftsmith.core.sampling import SamplingParams
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.export.layout import EXPORTERS
from draftsmith.heads.dflash import DFlashDrafter
from draftsmith.heads.dflash2 import DFlash2Drafter, DynamicConv, dynamic_conv, training_candidates
from draftsmith.testing import tiny_target
from tests.helpers import batch_for


def make(block_size=4, draft_vocab_size=100, top_k=6, seed=0, perturb=True, loss="kl"):
    target = tiny_target(num_layers=4, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    counts = torch.randint(0, 50, (target.vocab_size,))
    cfg = DFlash2Drafter.Config(block_size=block_size, num_layers=2, draft_vocab_size=draft_vocab_size, num_anchors=4,
                                loss_decay_gamma=2.0, conv_group_size=8, selector_rank=8, selector_top_k=top_k,
                                selector_weight=0.7, loss=loss)
    d = DFlash2Drafter.from_target(cfg, target, counts)
    if perturb:  # away from the identity init, so convolutions and selector matter
        with torch.no_grad():
            for p in d.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return target, d


# --------------------------------------------------------------------------- the convolution
def reference_conv(x, delta, base, block_size):
    """out[t, c] = sum_j (base[j, c] + delta[t, j, c // group]) * x[t - j, c] over taps inside t's block."""
    b, n, h = x.shape
    K, G = base.shape[0], delta.shape[-1]
    out = torch.zeros_like(x)
    for r in range(b):
        for t in range(n):
            for c in range(h):
                for j in range(K):
                    if t % block_size >= j:
                        out[r, t, c] += (base[j, c] + delta[r, t, j, c // (h // G)]) * x[r, t - j, c]
    return out


def test_dynamic_conv_matches_hand_written_reference():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 6, generator=g)  # 3 blocks of 3
    delta = torch.randn(2, 9, 2, 3, generator=g)  # 2 taps, 3 groups of 2 channels
    base = torch.randn(2, 6, generator=g)
    got = dynamic_conv(x, delta, base, block_size=3)
    assert torch.allclose(got, reference_conv(x, delta, base, 3), atol=1e-6)
    # the first slot of every block sees no earlier slot: changing the last slot of block 0 leaves block 1 alone
    y = x.clone()
    y[:, 2] += 5.0
    assert torch.equal(dynamic_conv(y, delta, base, 3)[:, 3:], got[:, 3:])


def test_conv_layer_is_the_hand_written_composition():
    target, d = make()
    layer = d.layers[0]
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1, 2 * d.block_size, 32, generator=g)
    ctx = d.context(torch.randn(1, 5, 3 * 32, generator=g))
    (k, v), _ = d.context_kv(ctx, torch.arange(5).view(1, -1))
    pos = torch.arange(5, 5 + x.shape[1]).view(1, -1)
    cos, sin = d.rotary(x, pos)

    def conv(mod, which, inp, kernel_from):
        deltas = mod.kernel_projection(kernel_from).view(1, x.shape[1], 2, mod.kernel_size, mod.num_groups)
        return reference_conv(inp, deltas[..., which, :, :], mod.base_kernel[which], d.block_size)

    xn = layer.input_layernorm(x)
    h1 = x + conv(layer.attention_conv, 1, layer.self_attn(conv(layer.attention_conv, 0, xn, xn), cos, sin, k, v),
                  xn)
    hn = layer.post_attention_layernorm(h1)
    want = h1 + conv(layer.mlp_conv, 1, layer.mlp(conv(layer.mlp_conv, 0, hn, hn)), hn)
    assert torch.allclose(layer(x, cos, sin, k, v), want, atol=1e-5)


def test_fresh_dflash2_backbone_computes_dflash():
    """Identity convolutions: with DFlash's weights copied in, the block hidden states are DFlash's."""
    target, d2 = make(perturb=False)
    torch.manual_seed(5)
    d1 = DFlashDrafter.from_target(DFlashDrafter.Config(**{f: getattr(d2.cfg, f) for f in (
        "block_size", "num_layers", "draft_vocab_size", "num_anchors", "loss_decay_gamma")}), target,
        torch.randint(0, 50, (target.vocab_size,)))
    missing = d2.load_state_dict(d1.state_dict(), strict=False).missing_keys
    assert missing and all("conv" in k or "candidate_selector" in k for k in missing)
    batch = batch_for(target, d2)
    anchors = torch.tensor([[2, 5], [1, 6]])
    assert torch.allclose(d2.blocks_hidden(batch, anchors), d1.blocks_hidden(batch, anchors), atol=1e-6)
    assert isinstance(d2.layers[0].attention_conv, DynamicConv)


# --------------------------------------------------------------------------- the selector
def test_selector_scores_match_hand_written_reference():
    _, d = make()
    sel = d.candidate_selector
    g = torch.Generator().manual_seed(2)
    unary, hidden = torch.randn(3, 100, generator=g), torch.randn(3, 32, generator=g)
    prev, cands = torch.tensor([4, 17, 250]), torch.tensor([[0, 5, 9], [99, 3, 3], [42, 7, 1]])
    got = sel.scores(unary, hidden, prev, cands).detach()
    A, B, W = (t.detach() for t in (sel.predecessor_codebook, sel.successor_codebook, sel.hidden_projection.weight))
    for t in range(3):
        for j in range(3):
            c = int(cands[t, j])
            want = unary[t, c] + sum(float(A[prev[t], r] * (W[r] @ hidden[t]) * B[c, r]) for r in range(A.shape[1]))
            assert math.isclose(float(got[t, j]), float(want), rel_tol=1e-4, abs_tol=1e-5)


def test_training_candidates_inject_a_missing_label_in_the_last_place():
    unary = torch.tensor([[0.0, 3.0, 1.0, 2.0, -1.0], [5.0, 4.0, 3.0, 2.0, 1.0]])
    cands, place, found = training_candidates(unary, torch.tensor([3, 4]), top_k=3)
    assert cands.tolist() == [[1, 3, 2], [0, 1, 4]]  # row 0: label in the top 3; row 1: injected at place 2
    assert place.tolist() == [1, 2] and found.tolist() == [True, False]


# --------------------------------------------------------------------------- the loss
@pytest.mark.parametrize("loss", ["kl", "dpace"])
def test_loss_matches_hand_written_reference(loss):
    """Per anchor and slot: the block through the inference path (one block, context < p, no mask), explicit
    KL, the unary top-K with the argmax injected, S = U + <A[x_{p+i-1}] * W h, B[c]>, cross entropy, all under
    the fixed decay; with loss=dpace the unary term is instead the CE of the target's full-vocabulary argmax
    (0 outside the draft vocabulary) under D-PACE's weights (test_dpace.loop_weights, alpha 0.5)."""
    target, d = make(top_k=3, loss=loss)
    batch = batch_for(target, d)
    d.eval()
    out = d.forward_loss(batch)
    anchors, ok = d.anchors_for(batch)
    ids, s = batch["input_ids"], batch["input_ids"].shape[1]
    mask = (batch["loss_mask"] * batch["attention_mask"]).float()
    draft_ids, sel = d.draft_ids(), d.candidate_selector
    total, count, injected = 0.0, 0, 0
    for row in range(anchors.shape[0]):
        for a in range(anchors.shape[1]):
            if not ok[row, a]:
                continue
            p = int(anchors[row, a])
            hard_ce, q, on = [], [], []  # per slot 1.. of this block: D-PACE's terms
            aux = batch["aux_hidden_states"][row : row + 1, :p]
            ctx_kv = d.context_kv(d.context(aux), torch.arange(p).view(1, -1))
            block = torch.tensor([[int(ids[row, p])] + [d.mask_token_id] * (d.block_size - 1)])
            hidden = d.block_hidden(block, torch.arange(p, p + d.block_size).view(1, -1), ctx_kv)[0]  # [B, h]
            for i in range(1, d.block_size):
                on.append(int(p + i < s and mask[row, p + i] != 0))
                unary = d.lm_head(hidden[i])
                full_top = int(batch["target_logits"][row, min(p + i - 1, s - 1)].argmax())
                logq = torch.log_softmax(unary, -1)
                in_draft = full_top in draft_ids.tolist()
                hard_ce.append(-logq[draft_ids.tolist().index(full_top)] if in_draft else torch.zeros(()))
                q.append(float(hard_ce[-1].detach().neg().exp()) if in_draft else 0.0)
                if not on[-1]:
                    continue
                target_logits = batch["target_logits"][row, p + i - 1, draft_ids]
                target_p = torch.softmax(target_logits, -1)
                kl = (target_p * (target_p.log() - torch.log_softmax(unary, -1))).sum()
                label = int(target_logits.argmax())
                cands = sorted(range(len(unary)), key=lambda c: -float(unary[c]))[:3]
                if label not in cands:
                    cands[-1] = label
                    injected += 1
                prev = int(ids[row, p + i - 1])
                ctx = sel.predecessor_codebook[prev] * (sel.hidden_projection.weight @ hidden[i])
                scores = torch.stack([unary[c] + (ctx * sel.successor_codebook[c]).sum() for c in cands])
                ce = -torch.log_softmax(scores, 0)[cands.index(label)]
                unary_term = kl if loss == "kl" else 0.0  # D-PACE's unary terms are added per block below
                total = total + math.exp(-(i - 1) / d.cfg.loss_decay_gamma) * (unary_term + 0.7 * ce)
                count += 1
            if loss == "dpace":
                w = loop_weights(q, on, 0.5)
                total = total + sum(wi * ce_i for wi, ce_i, o in zip(w, hard_ce, on) if o)
    assert count == out.num_tokens > 0 and injected > 0
    assert torch.allclose(out.loss, torch.as_tensor(total), rtol=1e-4, atol=1e-5), (out.loss, total)
    assert {"acc_0", "candidate_recall", "selector_acc", "selector_loss"} <= set(out.metrics)


def test_training_moves_the_convolutions_and_the_selector():
    target, d = make(perturb=False)
    batch = batch_for(target, d)
    before = {k: v.clone() for k, v in d.state_dict().items()}
    opt = torch.optim.Adam(d.trainable_parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        d.forward_loss(batch).loss.backward()
        opt.step()
    after = d.state_dict()
    for name in ("layers.0.attention_conv.base_kernel", "layers.1.mlp_conv.kernel_projection.weight",
                 "candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                 "candidate_selector.hidden_projection.weight"):
        assert not torch.equal(before[name], after[name]), name
    assert torch.equal(before["lm_head.weight"], after["lm_head.weight"])  # frozen, as DFlash's


# --------------------------------------------------------------------------- inference
def test_proposal_q_lives_on_the_unary_top_k_and_sums_to_one():
    target, d = make(top_k=4)
    d.eval()
    prompt = torch.randint(3, target.vocab_size, (9,), generator=torch.Generator().manual_seed(3))
    prop = d.make_proposer(target)
    prop.begin(prompt)
    prop.commit(prompt, 8, target.forward(prompt[None, :-1]))
    with torch.no_grad():
        draft = prop.propose(prompt, 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
        top = d.draft_ids()[d.lm_head(prop.block_hidden(prompt)[1:4]).topk(4, -1).indices]  # [3, K] target ids
    assert draft.tokens.shape == (3,) and draft.probs.shape == (3, target.vocab_size)
    for i in range(3):
        support = set(draft.probs[i].nonzero().flatten().tolist())
        assert support <= set(top[i].tolist()) and len(support) > 1 and int(draft.tokens[i]) in support
        assert math.isclose(float(draft.probs[i].sum()), 1.0, rel_tol=1e-5)


@pytest.mark.parametrize("k", [3, 2])
def test_greedy_decoding_is_lossless(k):
    target, d = make()
    d.eval()
    prompt = torch.randint(3, target.vocab_size, (6,), generator=torch.Generator().manual_seed(4))
    base = generate(target, None, prompt, LoopConfig(k=0, max_new_tokens=24))
    spec = generate(target, d.make_proposer(target), prompt, LoopConfig(k=k, max_new_tokens=24))
    assert spec.tokens == base.tokens and max(r.proposed for r in spec.rounds) == k


def test_bad_options_name_the_option_and_the_fix():
    from draftsmith import config

    with pytest.raises(config.ConfigError, match="drafter.conv_kernel_size 7: at most block_size"):
        config.from_dict({"drafter": {"kind": "dflash2", "block_size": 6, "conv_kernel_size": 7}})
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    with pytest.raises(ValueError, match="drafter.conv_group_size 12: must divide the target's hidden size 32"):
        DFlash2Drafter.from_target(DFlash2Drafter.Config(conv_group_size=12), target)
    with pytest.raises(ValueError, match="drafter.selector_top_k 200: at most the draft vocabulary"):
        DFlash2Drafter.from_target(DFlash2Drafter.Config(draft_vocab_size=100, selector_top_k=200), target)


# --------------------------------------------------------------------------- export
@pytest.mark.parametrize("fmt,pr", [("vllm", "vllm-project/vllm#52816"), ("sglang", "sgl-project/sglang#35371")])
def test_engine_formats_refuse_in_one_line_naming_the_pr(fmt, pr):
    with pytest.raises(ValueError) as err:
        EXPORTERS.get(fmt)().layout("dflash2")
    msg = str(err.value)
    assert pr in msg and "\n" not in msg and msg.startswith(f"--to {fmt} does not take dflash2 drafters: ")


def test_llama_cpp_serves_full_vocab_dflash2_and_refuses_a_reduced_one_in_one_line():
    """llama.cpp 0.3.36 converts and serves DFlash 2 (export/llamacpp/block.py); its selector reads target ids."""
    from types import SimpleNamespace

    from draftsmith.export.llamacpp import layouts as llamacpp

    target, d = make(draft_vocab_size=None, top_k=4)  # 4 * 5 <= hidden 32: the lattice fits one row
    from draftsmith.export import can_export

    assert can_export("dflash2", "llama.cpp") == []
    assert llamacpp.refusal(SimpleNamespace(drafter=d, target=target)) is None
    target, d = make()  # draft vocabulary 100 of 259
    why = llamacpp.refusal(SimpleNamespace(drafter=d, target=target))
    assert why.startswith("--to llama.cpp: this DFlash 2 drafter has a reduced draft vocabulary (100 of 259)")
    assert "\n" not in why


@pytest.mark.parametrize("fmt,pr", [("vllm", "vllm-project/vllm#52816"), ("sglang", "sgl-project/sglang#35371")])
def test_export_command_refuses_in_one_line_and_writes_nothing(fmt, pr, tmp_path):
    from draftsmith.checkpoint import LoadedDrafter
    from draftsmith.export.api import export

    target, d = make()
    loaded = LoadedDrafter(drafter=d, target=target, config=None, meta={})
    with pytest.raises(ValueError) as err:
        export(None, fmt, tmp_path / "out", loaded=loaded)
    assert str(err.value).startswith(f"--to {fmt} does not take dflash2 drafters: ") and pr in str(err.value)
    assert not (tmp_path / "out").exists()


def test_sampled_first_draft_follows_the_reported_q():
    """Stochastic verification needs x_1 ~ q_1 exactly: 4,000 draws of slot 1 against the q reported with them."""
    target, d = make(top_k=4)
    d.eval()
    prompt = torch.randint(3, target.vocab_size, (9,), generator=torch.Generator().manual_seed(6))
    prop = d.make_proposer(target)
    prop.begin(prompt)
    prop.commit(prompt, 8, target.forward(prompt[None, :-1]))
    sampling, g = SamplingParams(temperature=1.5), torch.Generator().manual_seed(1)
    with torch.no_grad():
        hidden = prop.block_hidden(prompt)
        draws = [d.draft_block(hidden, prompt[-1], 1, prop, sampling, g) for _ in range(4000)]
    q = draws[0].probs[0]
    assert all(torch.equal(x.probs[0], q) for x in draws[:50])  # one q for slot 1 (its predecessor is the anchor)
    counts = torch.bincount(torch.cat([x.tokens for x in draws]), minlength=q.shape[0]).float()
    assert (q > 0.05).sum() >= 2  # a real choice among candidates
    assert float((counts / counts.sum() - q).abs().sum() / 2) < 0.03  # total variation of 4,000 draws
