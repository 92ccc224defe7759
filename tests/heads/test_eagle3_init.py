"""EAGLE-3 init: `init_fan_in_cap` caps each linear layer's Normal std at torch's default std for its fan-in,
1 / sqrt(3 * fan_in), checked against stds written out by hand for a wide draft layer; a layer whose fan-ins
are all small is initialised bit for bit as without the cap."""
from __future__ import annotations

import pytest
import torch

from draftsmith.heads.eagle3 import Eagle3Drafter
from draftsmith.testing import tiny_target

# Wide draft layer on a hidden-32 target: 32 heads x 64, 8 kv heads, intermediate 4096.
WIDE = {"num_heads": 32, "num_kv_heads": 8, "head_dim": 64, "intermediate_size": 4096}
# module -> (fan_in, std with the cap), by hand: min(0.02, 1 / sqrt(3 * fan_in)).
WIDE_STDS = {
    "fc": (3 * 32, 0.02),                         # 1/sqrt(288)   = 0.0589 > 0.02
    "midlayer.self_attn.q_proj": (64, 0.02),      # 2h inputs: 1/sqrt(192) = 0.0722
    "midlayer.self_attn.k_proj": (64, 0.02),
    "midlayer.self_attn.v_proj": (64, 0.02),
    "midlayer.self_attn.o_proj": (2048, 0.012758),  # 32 x 64 inputs: 1/sqrt(6144)
    "midlayer.mlp.gate_proj": (32, 0.02),
    "midlayer.mlp.up_proj": (32, 0.02),
    "midlayer.mlp.down_proj": (4096, 0.009021),   # 1/sqrt(12288)
}


def build(seed=0, **options):
    target = tiny_target(num_layers=4, hidden=32, seed=0)
    torch.manual_seed(seed)
    return Eagle3Drafter.from_target(Eagle3Drafter.Config(ttt_steps=2, **options), target)


def test_wide_layer_stds_are_capped_by_fan_in():
    drafter = build(**WIDE, init_fan_in_cap=True)
    modules = dict(drafter.named_modules())
    for name, (fan_in, std) in WIDE_STDS.items():
        weight = modules[name].weight
        assert weight.shape[1] == fan_in, name
        assert weight.std().item() == pytest.approx(std, rel=0.06), name  # >= 2,048 samples each


def test_without_the_cap_every_layer_keeps_init_std():
    drafter = build(**WIDE)
    modules = dict(drafter.named_modules())
    for name in WIDE_STDS:
        assert modules[name].weight.std().item() == pytest.approx(0.02, rel=0.06), name


def test_cap_changes_nothing_when_every_fan_in_is_small():
    plain, capped = build(seed=3), build(seed=3, init_fan_in_cap=True)  # the target's shape: fan-ins <= 96
    for (name, a), b in zip(plain.state_dict().items(), capped.state_dict().values()):
        assert torch.equal(a, b), name


def test_cap_only_shrinks_the_wide_projections():
    plain, capped = build(seed=5, **WIDE), build(seed=5, **WIDE, init_fan_in_cap=True)
    sd_plain, sd_capped = plain.state_dict(), capped.state_dict()
    for name, (_, std) in WIDE_STDS.items():
        a, b = sd_plain[f"{name}.weight"], sd_capped[f"{name}.weight"]
        torch.testing.assert_close(b, a * (std / 0.02))  # same draws, scaled by the cap
