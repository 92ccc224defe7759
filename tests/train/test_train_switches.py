"""Recipe switches of memory-lean training: the TTT kernel and gradient checkpointing change no
loss; torch.compile runs through the loop; step metrics are read on the host in one copy."""
from __future__ import annotations

import pytest
import torch

from draftsmith.train.loop import to_host, train


def test_kernels_and_checkpointing_give_the_same_losses(tiny_run):
    runs = {}
    for name, overrides in {"eager": ["train.ttt_attention=eager"],
                            "chunked": ["train.ttt_attention=chunked"],
                            "ckpt": ["train.ttt_attention=chunked", "train.gradient_checkpointing=true"]}.items():
        runs[name] = train(tiny_run(name, "train.max_steps=3", "train.precision=fp32", *overrides)).losses
    assert len(runs["eager"]) == 3
    for name in ("chunked", "ckpt"):
        assert runs[name] == pytest.approx(runs["eager"], rel=1e-5)


def test_compile_switch_trains(tiny_run):
    result = train(tiny_run("compiled", "train.max_steps=2", "train.compile=eager"))
    assert len(result.losses) == 2 and all(x == x for x in result.losses)


def test_bad_kernel_name_is_a_config_error(tiny_run):
    from draftsmith.config import ConfigError

    with pytest.raises(ConfigError, match="train.ttt_attention"):
        tiny_run("bad", "train.ttt_attention=fast")


def test_to_host_keeps_order_and_plain_values():
    steps = [{"loss": torch.tensor(1.5), "lr": 0.1, "acc_0": torch.tensor(0.25, dtype=torch.float64)},
             {"loss": torch.tensor(0.5), "lr": 0.2, "acc_0": 0.75}]
    assert to_host(steps) == [{"loss": 1.5, "lr": 0.1, "acc_0": 0.25}, {"loss": 0.5, "lr": 0.2, "acc_0": 0.75}]
    assert to_host([{"lr": 1.0}]) == [{"lr": 1.0}]
