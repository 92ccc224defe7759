"""Parallelism applied from outside the drafter. Single process here; DDP, FSDP2 and DeepSpeed
are selected with train.backend and set up by `setup` (launched under torchrun).

The training loop only talks to a ParallelContext: rank/world facts, the wrapped model, a sum
all-reduce, and the factor that turns accumulated per-token loss sums into a mean over the
global count of valid tokens.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class ParallelContext:
    backend: str = "single"
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            import torch.distributed as dist

            value = value.clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value

    def grad_scale(self, global_tokens: float) -> float:
        """Factor for accumulated gradients of loss SUMS so they become d(mean over global tokens).

        DDP/FSDP average gradients over ranks (divide by world), so multiply back by world_size.
        """
        return self.world_size / max(global_tokens, 1.0)


def setup(train_cfg, device: torch.device) -> ParallelContext:
    if train_cfg.backend == "single":
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            raise RuntimeError("launched with WORLD_SIZE > 1 but train.backend is single; set train.backend=ddp|fsdp2|deepspeed")
        return ParallelContext("single", 0, 1, device)
    raise NotImplementedError(f"train.backend={train_cfg.backend} is not available in this build; use train.backend=single")


def wrap(ctx: ParallelContext, drafter: torch.nn.Module) -> torch.nn.Module:
    """The module the loop calls forward_loss on (the drafter itself in a single process)."""
    return drafter
