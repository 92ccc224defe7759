"""The learn-fast levers of EAGLE-3 (issue 41), each checked against what it promises:
(a) drafter.layer_init=target: the draft layer and fc start as target layer aux[-1], so the step-0 state
    IS the target's next hidden state; (b) drafter.label_temperature: the soft labels are
    softmax(logits / T); (d) drafter.ttt_anchor_fraction: TTT at sampled anchors equals the full unroll
    at those anchors, and steps >= 1 run at that fraction of the positions."""
from __future__ import annotations

import pytest
import torch

from draftsmith.heads import vocab_loss
from draftsmith.heads.draft_layer import ttt_attention
from draftsmith.heads.eagle3 import Eagle3Drafter, anchors_at, sample_anchors
from draftsmith.testing import tiny_target
from tests.helpers import batch_for


def drafter_for(target, **options):
    torch.manual_seed(0)
    return Eagle3Drafter.from_target(Eagle3Drafter.Config(ttt_steps=3, **options), target)


# ------------------------------------------------------------------ (a) warm start from a target layer
def test_a_warm_started_draft_layer_is_the_target_layer_at_step_0():
    target = tiny_target(num_layers=4, hidden=32)
    batch = batch_for(target, drafter_for(target, aux_layer_ids=[0, 1, 2]), b=2, s=10)
    with torch.no_grad():
        hidden = target.forward(batch["input_ids"], batch["attention_mask"]).hidden_states  # input of layer i at [i]
    for init, same in (("target", True), ("random", False)):
        d = drafter_for(target, aux_layer_ids=[0, 1, 2], layer_init=init)
        with torch.no_grad():
            _, state = next(d.unroll(batch, steps=1, states=True))  # [1, 9, h]: step 0 at positions 0..8
        close = torch.allclose(state[0], hidden[3][0, :9], atol=1e-4)  # target layer 2's output
        assert close is same, (init, (state[0] - hidden[3][0, :9]).abs().max())


def test_a_warm_start_from_the_last_layer_gives_the_targets_own_logits_at_step_0():
    """aux[-1] = the last layer: the step-0 state is the target's last pre-norm state, and with the target's final
    norm scale in front of the copied lm_head the drafter's logits are the target's own (no draft vocabulary)."""
    target = tiny_target(num_layers=4, hidden=32)
    with torch.no_grad():  # a final norm far from its ones start, so a drafter that kept ones would differ
        target.model.get_decoder().norm.weight.uniform_(0.5, 2.5)
    d = drafter_for(target, aux_layer_ids=[0, 1, 3], layer_init="target")
    batch = batch_for(target, d, b=2, s=10)
    with torch.no_grad():
        logits = target.forward(batch["input_ids"], batch["attention_mask"]).logits
        step0 = next(d.unroll(batch, steps=1))[1]  # [b, 9, V]
    assert torch.allclose(d.norm.weight, target.model.get_decoder().norm.weight, atol=1e-5)
    assert torch.allclose(step0[0], logits[0, :9], atol=1e-4), (step0[0] - logits[0, :9]).abs().max()  # row 0: unpadded


def test_norm_scales_are_read_off_the_modules_so_a_one_plus_w_norm_copies_right():
    """Gemma's RMSNorm computes x * (1 + w): the final norm and the layer's norms copy as 1 + w, not w."""
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    target = tiny_target(num_layers=2, hidden=32)
    decoder = target.model.get_decoder()
    norms = {}
    for name, owner, attr in (("final", decoder, "norm"), ("input", decoder.layers[1], "input_layernorm"),
                              ("post", decoder.layers[1], "post_attention_layernorm")):
        norms[name] = Gemma3RMSNorm(32)
        with torch.no_grad():
            norms[name].weight.uniform_(-0.5, 0.5)
        setattr(owner, attr, norms[name])
    d = drafter_for(target, aux_layer_ids=[0, 1], layer_init="target")
    assert torch.allclose(d.norm.weight, 1 + norms["final"].weight, atol=1e-5)
    assert torch.allclose(d.midlayer.hidden_norm.weight, 1 + norms["input"].weight, atol=1e-5)
    assert torch.allclose(d.midlayer.input_layernorm.weight, 1 + norms["input"].weight, atol=1e-5)
    assert torch.allclose(d.midlayer.post_attention_layernorm.weight, 1 + norms["post"].weight, atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen3", "gemma3-text", "gemma2"])
def test_training_refuses_a_warm_start_from_a_layer_with_norms_the_draft_layer_lacks(arch):
    """Refused by `train` before any data (check_for_training), by name; a drafter already trained that way still
    loads (from_target copies what it can, and the checkpoint's weights replace it)."""
    from draftsmith.core.errors import UserError
    from draftsmith.heads import check_for_training
    from draftsmith.testing import arch_target

    target = arch_target(arch)
    options = Eagle3Drafter.Config(ttt_steps=2, layer_init="target")
    with pytest.raises(UserError, match=r"also runs .*(q_norm|feedforward_layernorm).*layer_init=random"):
        check_for_training(target, "eagle3", options)
    check_for_training(target, "eagle3", Eagle3Drafter.Config(ttt_steps=2))  # layer_init random: fine
    Eagle3Drafter.from_target(options, target)  # the load path: no refusal


@pytest.mark.parametrize("arch", ["llama3", "qwen2.5", "mistral"])
def test_llama_style_layers_still_warm_start(arch):
    from draftsmith.heads import check_for_training
    from draftsmith.testing import arch_target

    target = arch_target(arch)
    options = Eagle3Drafter.Config(ttt_steps=2, layer_init="target")
    check_for_training(target, "eagle3", options)
    d = Eagle3Drafter.from_target(options, target)
    assert torch.allclose(d.norm.weight, target.model.get_decoder().norm.weight.float(), atol=1e-5)


def test_the_embedding_half_starts_at_zeros_or_as_a_copy():
    target = tiny_target(num_layers=4, hidden=32)
    source = target.model.get_decoder().layers[2].self_attn.q_proj.weight
    for half, expected in (("zeros", torch.zeros_like(source)), ("copy", source)):
        d = drafter_for(target, aux_layer_ids=[0, 1, 2], layer_init="target", layer_init_embed_half=half)
        q = d.midlayer.self_attn.q_proj.weight
        assert torch.equal(q[:, 32:], source) and torch.equal(q[:, :32], expected)
    fc = d.fc.weight
    assert torch.equal(fc[:, 64:], torch.eye(32)) and not fc[:, :64].any()


def test_a_draft_layer_of_another_shape_cannot_warm_start_in_one_line():
    from draftsmith.core.errors import UserError

    target = tiny_target(num_layers=4, hidden=32)
    with pytest.raises(UserError, match="intermediate_size"):
        drafter_for(target, layer_init="target", intermediate_size=48)
    problems = Eagle3Drafter.Config(layer_init="target").problems()
    assert problems == []


# ------------------------------------------------------------------ (b) teacher signal
def test_the_label_temperature_spreads_the_soft_labels():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 40) * 3
    draft_ids = torch.arange(0, 40, 2)
    p1, top1 = vocab_loss.soft_labels(logits, draft_ids)
    p2, top2 = vocab_loss.soft_labels(logits, draft_ids, temperature=2.0)
    assert torch.allclose(p2, torch.softmax(logits[..., draft_ids] / 2, -1)) and torch.equal(top1, top2)
    entropy = lambda p: -(p * p.log()).sum(-1).mean()  # noqa: E731
    assert entropy(p2) > entropy(p1) + 0.1
    target = tiny_target(num_layers=4, hidden=32)
    losses = []
    for t in (1.0, 2.0):
        d = drafter_for(target, hard_label_weight=0.0, label_temperature=t)
        losses.append(float(d.forward_loss(batch_for(target, d)).loss.detach()))
    assert abs(losses[0] - losses[1]) > 1e-3
    assert "drafter.label_temperature" in "\n".join(Eagle3Drafter.Config(label_temperature=0).problems())


# ------------------------------------------------------------------ (d) sampled TTT anchors
def test_anchored_ttt_attention_equals_the_full_attention_at_the_anchors():
    torch.manual_seed(0)
    b, H, KV, n, d = 2, 4, 2, 12, 8
    q_full = torch.randn(b, H, n, d)
    k0, v0 = torch.randn(b, KV, n, d), torch.randn(b, KV, n, d)
    chain = [(torch.randn(b, KV, n, d), torch.randn(b, KV, n, d)) for _ in range(2)]
    docs = torch.tensor([[0] * 5 + [1] * 7, [0] * 12])
    anchors = torch.tensor([1, 4, 5, 9, 11])
    for window in (None, 4):
        full = ttt_attention(q_full, [(k0, v0), *chain], docs, d ** -0.5, "eager", window=window)
        part = ttt_attention(q_full[:, :, anchors], [(k0, v0), *[(k[:, :, anchors], v[:, :, anchors]) for k, v in chain]],
                             docs, d ** -0.5, "eager", window=window, anchors=anchors)
        assert torch.allclose(part, full[:, :, anchors], atol=1e-5)


def test_every_position_as_an_anchor_is_the_full_unroll_and_a_quarter_runs_a_quarter():
    target = tiny_target(num_layers=4, hidden=32)
    full = drafter_for(target)
    batch = batch_for(target, full, b=2, s=24)
    everywhere = drafter_for(target, ttt_anchor_fraction=0.9999)  # ceil(0.9999 * 23) = 23: every index, sampled path
    torch.manual_seed(1)
    a, b_ = full.forward_loss(batch), everywhere.forward_loss(batch)
    assert torch.allclose(a.loss, b_.loss, rtol=1e-5) and a.metrics == pytest.approx(b_.metrics)
    quarter = drafter_for(target, ttt_anchor_fraction=0.25)
    out = quarter.forward_loss(batch)
    assert out.weights["acc_0"] == a.weights["acc_0"]  # step 0 runs everywhere
    assert out.weights["acc_1"] < 0.45 * a.weights["acc_1"] and out.weights["acc_2"] > 0
    out.loss.backward()
    assert quarter.midlayer.self_attn.q_proj.weight.grad.abs().sum() > 0
    quarter.eval()  # held-out evaluation: every position
    assert quarter.forward_loss(batch).weights == a.weights
    anchors = sample_anchors(23, 0.25, "cpu")
    assert len(anchors) == 6 and torch.equal(anchors, anchors.sort().values)
    assert (anchors_at(anchors, 24, 2) < 21).all() and sample_anchors(23, None, "cpu") is None
    assert "drafter.ttt_anchor_fraction" in "\n".join(Eagle3Drafter.Config(ttt_anchor_fraction=1.5).problems())
