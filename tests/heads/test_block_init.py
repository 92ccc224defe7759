"""Block drafters' init options (issue 21): `init_std` draws fc's and the draft layers' linear weights from
Normal(0, init_std) and leaves the rest (norms, the copied lm_head) as before; DSpark's
`markov_zero_init=False` keeps torch's init for the Markov W2, so W1 gets a token-loss gradient from the first step."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from draftsmith.heads.dflash import DFlashDrafter
from draftsmith.heads.dspark import DSparkDrafter
from draftsmith.testing import tiny_target
from tests.helpers import batch_for


def backbone_linears(d) -> dict[str, torch.Tensor]:
    return {name: m.weight for name, m in d.named_modules()
            if isinstance(m, nn.Linear) and (name == "fc" or name.startswith("layers."))}


@pytest.mark.parametrize("cls", [DFlashDrafter, DSparkDrafter], ids=["dflash", "dspark"])
def test_init_std_draws_the_backbone_linears_from_a_normal(cls):
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    torch.manual_seed(0)
    default = cls.from_target(cls.Config(block_size=4, num_layers=2), target)
    torch.manual_seed(0)
    normal = cls.from_target(cls.Config(block_size=4, num_layers=2, init_std=0.02), target)
    weights = backbone_linears(normal)
    assert len(weights) == 1 + 2 * 7  # fc + per layer q, k, v, o, gate, up, down
    pooled = torch.cat([w.flatten() for w in weights.values()])
    assert abs(float(pooled.std()) - 0.02) < 0.002 and abs(float(pooled.mean())) < 0.002
    kaiming = torch.cat([w.flatten() for w in backbone_linears(default).values()])
    assert float(kaiming.std()) > 0.05  # torch's default for these fan-ins (32..128) is far wider
    # untouched: the copied (frozen) lm_head and the norms
    assert torch.equal(normal.lm_head.weight, target.lm_head.weight[normal.draft_ids()].float())
    assert torch.equal(normal.norm.weight, torch.ones_like(normal.norm.weight))


def test_init_std_must_be_positive():
    problems = DFlashDrafter.Config(init_std=0.0).problems()
    assert any("init_std" in p for p in problems)
    assert not any("init_std" in p for p in DFlashDrafter.Config(init_std=0.02).problems())


@pytest.mark.parametrize("zero", [True, False])
def test_markov_zero_init_decides_whether_w1_learns_at_step_one(zero):
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    torch.manual_seed(0)
    d = DSparkDrafter.from_target(DSparkDrafter.Config(block_size=4, num_layers=2, num_anchors=4, markov_rank=8,
                                                       confidence_weight=0.0, markov_zero_init=zero), target)
    w2 = d.markov_head.markov_w2.weight
    assert bool((w2 == 0).all()) == zero
    batch = batch_for(target, d, seed=0)
    d.forward_loss(batch).loss.backward()
    w1_grad = d.markov_head.markov_w1.weight.grad
    # through the token loss d loss / d W1 = W2^T (d loss / d bias): exactly zero while W2 is zero (W1 also
    # feeds the confidence head, whose loss is switched off here)
    assert (w1_grad is None or float(w1_grad.abs().max()) == 0.0) == zero
    assert float(d.markov_head.markov_w2.weight.grad.abs().max()) > 0.0  # W2 learns either way
