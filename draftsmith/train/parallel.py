"""Parallelism applied from outside the drafter: single process, DDP, FSDP2 (fully_shard) or
DeepSpeed ZeRO 1/2/3, chosen with train.backend and launched under torchrun
(`draftsmith train RECIPE --nproc N` re-launches itself; see train/launch.py and docs/distributed.md).

The training loop only talks to a ParallelContext; every backend difference lives here:
  setup(train_cfg, device)          process group, device, rank facts
  ctx.wrap(drafter, make_optimizer) -> (module the loop calls, optimizer)
  ctx.accumulate(last)              gradient sync only on the last micro-batch of a step
  ctx.backward(loss)                backward of one micro-batch's loss SUM
  ctx.optimizer_step(...)           scale to d(mean over GLOBAL loss tokens), clip, step -> grad norm
  ctx.model_state_dict / optimizer_state_dict / load_*     full (unsharded) states for checkpoints
  ctx.save_engine_state / load_engine_state                DeepSpeed's own sharded checkpoint

Gradient normalisation: each rank backpropagates loss sums; DDP, FSDP2 and DeepSpeed all AVERAGE
gradients over ranks, so the mean over the N global loss tokens is (averaged grad) * world / N.
DeepSpeed's gradients live in ZeRO partitions, so there the same factor is applied as its loss
scale at step time (ZeRO divides by the loss scale before clipping and the update).
"""
from __future__ import annotations

import atexit
import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from draftsmith.core.errors import UserError

BACKENDS = ("single", "ddp", "fsdp2", "deepspeed")


@dataclass
class ParallelContext:
    backend: str = "single"
    rank: int = 0
    world_size: int = 1
    device: torch.device = torch.device("cpu")
    local_rank: int = 0
    train_cfg: Any = None
    model: Any = None  # what wrap() returned (DDP module, FSDP2 module, DeepSpeed engine, or the drafter)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.backend != "single"

    # ------------------------------------------------------------------ collectives
    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        if self.world_size > 1:
            import torch.distributed as dist

            value = value.to(self._comm_device()).clone()
            dist.all_reduce(value, op=dist.ReduceOp.SUM)
            value = value.cpu()
        return value

    def all_gather_object(self, obj: Any) -> list:
        if self.world_size == 1:
            return [obj]
        import torch.distributed as dist

        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def barrier(self) -> None:
        if self.distributed:
            import torch.distributed as dist

            dist.barrier()

    def _comm_device(self) -> torch.device:
        return self.device if self.device.type == "cuda" else torch.device("cpu")

    def grad_scale(self, global_tokens: float) -> float:
        """Factor for accumulated gradients of loss SUMS so they become d(mean over global tokens).

        DDP/FSDP/DeepSpeed average gradients over ranks (divide by world), so multiply back by world_size.
        """
        return self.world_size / max(global_tokens, 1.0)

    # ------------------------------------------------------------------ model and optimizer
    def wrap(self, drafter: nn.Module, make_optimizer: Callable[[list], torch.optim.Optimizer]):
        """-> (module the loop calls forward on, optimizer over the drafter's trainable parameters)."""
        if self.backend == "single":
            self.model = drafter
        elif self.backend == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = DistributedDataParallel(drafter, device_ids=ids)
        elif self.backend == "fsdp2":
            from torch.distributed.fsdp import fully_shard

            self.model = fully_shard(drafter)  # in place: parameters become DTensor shards
        elif self.backend == "deepspeed":
            return self._wrap_deepspeed(drafter, make_optimizer)
        return self.model, make_optimizer(drafter.trainable_parameters())

    def _wrap_deepspeed(self, drafter: nn.Module, make_optimizer):
        import deepspeed

        tc = self.train_cfg
        ds_cfg = deepspeed_config(tc)
        optimizer = None if tc.deepspeed.offload_optimizer else make_optimizer(drafter.trainable_parameters())
        engine, ds_optimizer, _, _ = deepspeed.initialize(model=drafter, optimizer=optimizer,
                                                          model_parameters=drafter.trainable_parameters(),
                                                          config=ds_cfg)
        if not hasattr(engine.optimizer, "override_loss_scale"):
            raise RuntimeError(f"DeepSpeed built a {type(engine.optimizer).__name__}, which cannot take the global "
                               "token normalisation; use train.deepspeed.zero_stage=1|2|3")
        self.model = engine
        # The scheduler steps the torch optimizer DeepSpeed wraps (ZeRO keeps its param_groups).
        inner = getattr(ds_optimizer, "optimizer", ds_optimizer)
        return engine, inner

    @contextlib.contextmanager
    def accumulate(self, last: bool):
        """Forward + backward of one micro-batch; gradients are synchronised only when `last`."""
        if self.backend == "ddp" and not last:
            with self.model.no_sync():
                yield
            return
        if self.backend == "fsdp2":
            self.model.set_requires_gradient_sync(last)
        if self.backend == "deepspeed":
            self.model.set_gradient_accumulation_boundary(last)  # one engine.step() per optimizer step
        yield

    def backward(self, loss: torch.Tensor) -> None:
        if self.backend == "deepspeed":
            self.model.optimizer.override_loss_scale(1.0)
            self.model.backward(loss, scale_wrt_gas=False)  # loss sums; the step normalises
        else:
            loss.backward()

    def optimizer_step(self, optimizer, params: list, global_tokens: float, max_grad_norm: float,
                       scaler=None) -> float:
        """Turn accumulated gradients of loss sums into d(mean over global loss tokens), clip, step.
        Returns the gradient norm before clipping (a tensor, or a float under DeepSpeed). `scaler` (fp16): a
        torch GradScaler whose scaled losses were backpropagated; gradients are unscaled first and a step with
        inf/nan is skipped."""
        scale = self.grad_scale(global_tokens)
        if self.backend == "deepspeed":
            engine = self.model
            engine.optimizer.override_loss_scale(1.0 / scale)  # ZeRO divides gradients by the loss scale
            engine.step()
            engine.optimizer.override_loss_scale(1.0)
            norm = engine.get_global_grad_norm()
            return float(norm) if norm is not None else float("nan")
        if scaler is not None:
            scaler.unscale_(optimizer)  # fp16: divide out the loss scale (records inf/nan)
        for p in params:
            if p.grad is not None:
                p.grad.mul_(scale)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm)
        if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor
            grad_norm = grad_norm.full_tensor()
        if scaler is not None:
            scaler.step(optimizer)  # skipped when the gradients overflowed
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm.detach()  # a device tensor: the loop reads it at log steps only

    # ------------------------------------------------------------------ checkpoint states
    def model_state_dict(self, drafter: nn.Module) -> dict[str, torch.Tensor]:
        """Full drafter weights on CPU on rank 0 ({} elsewhere). Collective: call on every rank."""
        if self.backend == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            return get_model_state_dict(drafter, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.backend == "deepspeed" and self.train_cfg.deepspeed.zero_stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters(list(drafter.parameters()), modifier_rank=None):
                state = _cpu_state(drafter) if self.is_main else {}
            return state
        return _cpu_state(drafter) if self.is_main else {}

    def optimizer_state_dict(self, drafter: nn.Module, optimizer) -> dict | None:
        """Full optimizer state on rank 0 (None for DeepSpeed: its engine checkpoint holds it)."""
        if self.backend == "deepspeed":
            return None
        if self.backend == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            return get_optimizer_state_dict(drafter, optimizer,
                                            options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return optimizer.state_dict()

    def load_model_state(self, drafter: nn.Module, state: dict[str, torch.Tensor]) -> None:
        """Load full drafter weights on every rank (DeepSpeed loads them with its engine state)."""
        if self.backend == "deepspeed":
            return
        if self.backend == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(drafter, state, options=StateDictOptions(full_state_dict=True))
            return
        drafter.load_state_dict(state)

    def load_optimizer_state(self, drafter: nn.Module, optimizer, state: dict | None) -> None:
        if self.backend == "deepspeed":
            return
        if self.backend == "fsdp2":
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

            set_optimizer_state_dict(drafter, optimizer, state, options=StateDictOptions(full_state_dict=True))
            return
        optimizer.load_state_dict(state)

    def save_engine_state(self, directory: Path) -> None:
        """DeepSpeed: every rank writes its ZeRO partitions under directory/engine (shared filesystem)."""
        if self.backend == "deepspeed":
            self.model.save_checkpoint(str(directory / "engine"), tag="state", save_latest=False)

    def load_engine_state(self, directory: Path) -> None:
        if self.backend != "deepspeed":
            return
        engine_dir = directory / "engine"
        if not (engine_dir / "state").exists():
            raise FileNotFoundError(f"{engine_dir}/state is missing: {directory} was not written by the deepspeed "
                                    "backend; resume with the backend that wrote it, or warm start with train.init_from")
        check_engine_files(engine_dir)  # DeepSpeed itself unpickles them with weights_only=False
        load_path, _ = self.model.load_checkpoint(str(engine_dir), tag="state", load_optimizer_states=True,
                                                  load_lr_scheduler_states=False)
        if load_path is None:
            raise RuntimeError(f"DeepSpeed could not load {engine_dir}/state")


def check_engine_files(engine_dir: Path) -> None:
    """DeepSpeed loads its checkpoint files with torch.load(weights_only=False), which runs any code a
    received file plants. Read each file first with weights_only=True, allowing only the three
    DeepSpeed classes its ZeRO states hold, and refuse the checkpoint when anything else is inside."""
    import pickle

    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    for file in sorted(Path(engine_dir).rglob("*.pt")):
        try:
            with torch.serialization.safe_globals([LossScaler, ZeroStageEnum, fragment_address]):
                torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise UserError(f"{file} holds objects other than tensors, plain data and DeepSpeed's ZeRO state, which "
                             f"could run code when loaded ({first}); refused. Resume only from checkpoints written "
                             "by this draftsmith, or warm start from the weights with train.init_from") from None


def _cpu_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}


def deepspeed_config(tc) -> dict:
    """The DeepSpeed config a recipe's train section resolves to (printed in docs/distributed.md)."""
    ds = tc.deepspeed
    cfg: dict = {
        "train_micro_batch_size_per_gpu": tc.batch_size,
        "gradient_accumulation_steps": tc.grad_accum,
        "gradient_clipping": tc.max_grad_norm,
        "zero_optimization": {"stage": ds.zero_stage},
        "zero_allow_untested_optimizer": True,  # the client optimizer is torch's AdamW
        "steps_per_print": 10**9,
    }
    if ds.zero_stage == 0:
        raise UserError("train.deepspeed.zero_stage=0 is plain data parallelism: use train.backend=ddp instead")
    if ds.offload_optimizer:
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        cfg["optimizer"] = {"type": "AdamW", "params": {"lr": tc.lr, "betas": list(tc.betas),
                                                        "weight_decay": tc.weight_decay}}
    if tc.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif tc.precision == "fp16":
        raise UserError("train.precision=fp16 is not supported with train.backend=deepspeed; use bf16 or fp32")
    return cfg


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, str(default)))


def setup(train_cfg, device: torch.device) -> ParallelContext:
    """Process group and device for train.backend; torchrun (or --nproc) provides RANK/WORLD_SIZE."""
    backend = train_cfg.backend
    world = _env_int("WORLD_SIZE", 1)
    if backend == "single":
        if world > 1:
            raise RuntimeError("launched with WORLD_SIZE > 1 but train.backend is single; set train.backend=ddp|fsdp2|deepspeed")
        return ParallelContext("single", 0, 1, device, train_cfg=train_cfg)
    if backend not in BACKENDS:
        raise UserError(f"train.backend={backend!r} is not one of {BACKENDS}")
    rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
    if device.type == "cuda":
        torch.cuda.set_device(local_rank)  # "cuda" now means this rank's GPU (the target loads there too)
        device = torch.device("cuda", local_rank)
    if backend == "deepspeed" and device.type == "cpu":
        os.environ.setdefault("DS_ACCELERATOR", "cpu")  # read by DeepSpeed at import
    import torch.distributed as dist

    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29500"))
            os.environ.setdefault("RANK", "0")
            os.environ.setdefault("WORLD_SIZE", "1")
        dist_backend = "nccl" if device.type == "cuda" else "gloo"
        if backend == "deepspeed":
            import deepspeed

            deepspeed.init_distributed(dist_backend=dist_backend)
        else:
            dist.init_process_group(dist_backend)
    if rank != 0:
        _quiet_non_zero_rank()
    ctx = ParallelContext(backend, dist.get_rank(), dist.get_world_size(), device, local_rank, train_cfg)
    atexit.register(teardown, ctx)
    return ctx


def _quiet_non_zero_rank() -> None:
    import logging

    for name in ("DeepSpeed", "deepspeed", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)


def shard_target(ctx: ParallelContext, target) -> None:
    """FSDP2-shard the frozen target's decoder layers (each layer its own unit); the embedding,
    final norm and lm_head stay replicated because the drafter shares them outside the target's forward."""
    from torch.distributed.fsdp import fully_shard

    _ = target.fingerprint, target.legacy_fingerprints  # computed (and cached) from the full weights before sharding
    layers = getattr(getattr(target.model, "model", None), "layers", None)
    if layers is None:
        raise UserError(f"target {target.name}: no model.layers to shard; keep the target replicated")
    for layer in layers:
        fully_shard(layer)


def describe(ctx: ParallelContext) -> str:
    extra = ""
    if ctx.backend == "deepspeed":
        extra = " " + json.dumps(deepspeed_config(ctx.train_cfg)["zero_optimization"])
    return f"backend {ctx.backend}, world size {ctx.world_size}, device {ctx.device}{extra}"


def teardown(ctx: ParallelContext) -> None:
    if ctx.distributed:
        destroy_process_group()


def destroy_process_group() -> None:
    """Destroy the default process group so that the process can exit cleanly.

    A gloo worker thread drops its last reference to a finished collective (and so to the
    Python-owned tensors in it) only after the caller's wait() has returned, and it needs the GIL
    for that. If the interpreter starts finalizing first (a rank that exits right after its last
    collective), that thread is killed inside a C++ destructor and the rank aborts with
    "terminate called without an active exception" although all its work is done. FSDP2's
    DTensor caches keep the group (and its threads) alive past destroy_process_group, so the
    group's own shutdown does not help. Releasing the GIL for a moment lets those threads finish.
    """
    import time

    import torch.distributed as dist

    if dist.is_initialized():
        time.sleep(0.05)
        dist.destroy_process_group()
        time.sleep(0.05)
