"""Sliding-window drafts (`drafter.sliding_window`, issue 21 item 4): the TTT attention kernels and the block
drafters' training mask against masks written out by hand, EAGLE-3 tree drafting under a window equal to its
chain, the window changing what the drafters compute (so the train == loop tests that pass a window test
something), and the option ranges. Training-forward == loop with a window: test_eagle3 (proposer ==
unroll), test_dflash / test_peagle (proposer == training forward), test_block_loop_consistency (the real loop)."""
from __future__ import annotations

import math
import warnings

import pytest
import torch

from draftsmith.core.sampling import SamplingParams
from draftsmith.heads.dflash import DFlashDrafter
from draftsmith.heads.draft_layer import ttt_attention
from draftsmith.heads.dspark import DSparkDrafter
from draftsmith.heads.eagle3 import Eagle3Drafter
from draftsmith.heads.peagle import PEagleDrafter
from draftsmith.testing import tiny_target
from tests.helpers import batch_for

warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")


def reference_ttt(q, kv, window):
    """Step t = len(kv) - 1, query j (position j + t): an explicit list of visible keys, one softmax each.
    Step-0 key i (position i) when i <= j and (j + t) - i < window; step s's key at j (position j + s) when
    (j + t) - (j + s) < window."""
    b, H, n, d = q.shape
    t = len(kv) - 1
    out = torch.zeros_like(q)
    for bi in range(b):
        for h in range(H):
            g = h // (H // kv[0][0].shape[1])
            for j in range(n):
                keys = [(kv[0][0][bi, g, i], kv[0][1][bi, g, i]) for i in range(j + 1) if (j + t) - i < window]
                keys += [(kv[s][0][bi, g, j], kv[s][1][bi, g, j]) for s in range(1, t + 1) if t - s < window]
                scores = torch.stack([q[bi, h, j] @ k for k, _ in keys]) / math.sqrt(d)
                w = torch.softmax(scores, 0)
                out[bi, h, j] = sum(wi * v for wi, (_, v) in zip(w, keys))
    return out


@pytest.mark.parametrize("impl,chunk", [("eager", 4), ("chunked", 3), ("chunked", 64), ("flex", 4)])
@pytest.mark.parametrize("window,steps", [(1, 1), (2, 3), (3, 3), (5, 2)])
def test_ttt_window_equals_the_keys_written_out(impl, chunk, window, steps):
    g = torch.Generator().manual_seed(window * 10 + steps)
    n, d = 9, 8
    q = torch.randn(2, 4, n, d, generator=g)
    kv = [tuple(torch.randn(2, 2, n + steps - 1 - s, d, generator=g) for _ in range(2)) for s in range(steps)]
    with torch.no_grad():
        got = ttt_attention(q, kv, None, d ** -0.5, impl, chunk, window=window)
        full = ttt_attention(q, kv, None, d ** -0.5, impl, chunk)
    torch.testing.assert_close(got, reference_ttt(q, kv, window), rtol=1e-5, atol=1e-5)
    if window < n:
        assert not torch.allclose(got, full, atol=1e-4)  # the window removed keys


def test_dflash_training_mask_equals_the_window_written_out():
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    d = DFlashDrafter.from_target(DFlashDrafter.Config(block_size=3, num_anchors=3, sliding_window=2), target)
    anchors = torch.tensor([[1, 4, 6]])
    attention = torch.ones(1, 8, dtype=torch.long)
    attention[0, 0] = 0  # a padded first position is never seen
    mask = d.training_mask(anchors, attention)[0, 0]  # [A*B, s + A*B]
    want = torch.zeros(9, 8 + 9, dtype=torch.bool)
    for a, p in enumerate([1, 4, 6]):
        for slot in range(3):
            row = a * 3 + slot
            for j in range(8):  # context: real positions p - W .. p - 1
                want[row, j] = p - 2 <= j < p and j != 0
            want[row, 8 + a * 3 : 8 + a * 3 + 3] = True  # its own block, bidirectional
    assert torch.equal(mask, want)


def _eagle3(window, seed=0):
    target = tiny_target(num_layers=4, hidden=32, seed=seed)
    torch.manual_seed(seed + 1)
    d = Eagle3Drafter.from_target(Eagle3Drafter.Config(ttt_steps=3, sliding_window=window), target)
    with torch.no_grad():
        for p in d.trainable_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return target, d.eval()


def test_eagle3_tree_under_a_window_equals_its_chain():
    """Tree nodes sit at position committed + depth - 1 like chain steps: one-child trees see the same keys."""
    target, d = _eagle3(window=2)
    prompt = torch.randint(3, target.vocab_size, (8,), generator=torch.Generator().manual_seed(4))
    out = target.forward(prompt[None])
    with torch.no_grad():
        prop = d.make_proposer(target)
        prop.begin(prompt)
        prop.commit(prompt, prompt.shape[0], out)
        chain = prop.propose(prompt, 3, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))  # [3, V]
        root = prop.tree_root()  # crops the chain's entries back to the committed context
        first = prop.tree_expand(chain.tokens[:1], torch.tensor([-1]), 1)[0]
        second = prop.tree_expand(chain.tokens[1:2], torch.tensor([0]), 2)[0]
    for got, want in zip((root, first, second), chain.probs):
        torch.testing.assert_close(got.exp(), want, rtol=1e-4, atol=1e-6)


def test_the_window_changes_what_every_kind_computes():
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    for cls, options in ((Eagle3Drafter, {"ttt_steps": 3}), (PEagleDrafter, {"num_depths": 3}),
                         (DFlashDrafter, {"block_size": 4, "num_anchors": 4}),
                         (DSparkDrafter, {"block_size": 3, "num_anchors": 4, "markov_rank": 4})):
        losses = []
        for window in (None, 2):
            torch.manual_seed(0)
            d = cls.from_target(cls.Config(sliding_window=window, **options), target).eval()
            torch.manual_seed(5)
            with torch.no_grad():
                for p in d.trainable_parameters():
                    p.add_(0.05 * torch.randn_like(p))
                losses.append(float(d.forward_loss(batch_for(target, d, s=16)).loss))
        assert losses[0] != pytest.approx(losses[1], rel=1e-6), cls.kind


@pytest.mark.parametrize("cls", [Eagle3Drafter, PEagleDrafter, DFlashDrafter, DSparkDrafter])
def test_window_option_range(cls):
    assert any("sliding_window" in p for p in cls.Config(sliding_window=0).problems())
    assert not cls.Config(sliding_window=1).problems()


def test_eagle3_layer_shape_options_are_checked():
    assert any("head_dim: must be even" in p for p in Eagle3Drafter.Config(head_dim=7).problems())
    assert any("multiple of drafter.num_kv_heads" in p for p in Eagle3Drafter.Config(num_heads=6, num_kv_heads=4).problems())
    assert not Eagle3Drafter.Config(num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336).problems()
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    d = Eagle3Drafter.from_target(Eagle3Drafter.Config(num_heads=8, num_kv_heads=2, head_dim=12), target)
    attn = d.midlayer.self_attn
    assert (attn.num_heads, attn.num_kv_heads, attn.head_dim) == (8, 2, 12)
    assert attn.q_proj.weight.shape == (96, 64) and attn.o_proj.weight.shape == (32, 96)
    with pytest.raises(ValueError, match="hidden size 32 must be a multiple"):  # transformers would refuse the config
        Eagle3Drafter.from_target(Eagle3Drafter.Config(num_heads=6, num_kv_heads=2), target)
