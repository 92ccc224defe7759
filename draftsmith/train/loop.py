"""The one training loop. It never branches on the drafter kind.

One optimizer step, from start to end (`_train_step`):
  1. for each of grad_accum micro-batches: take the next batch from the data stream, complete its
     target features (online: a frozen target forward; offline: read from the cache), run
     drafter(batch) -> StepOutput(loss SUM over loss tokens, metrics, num_tokens), backward;
  2. all-reduce the loss-token count over ranks; scale gradients so the update is the gradient
     of the mean over the GLOBAL count of loss tokens (exact under accumulation and ranks);
  3. clip the gradient norm, optimizer step (AdamW), scheduler step (linear warmup + cosine).
Logged metrics (acc_i, loss_i, ...) are pooled over micro-batches and ranks, weighted by the tokens
each one averages (StepOutput.weights). train.precision=fp16 runs with a dynamic gradient scaler.

    from draftsmith import config
    from draftsmith.train.loop import train
    result = train(config.load("recipes/quickstart.yaml", ["train.max_steps=20"]))
"""
from __future__ import annotations

import contextlib
import math
import os
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from draftsmith import checkpoint as ckpt_io
from draftsmith import config as config_mod
from draftsmith.core.errors import UserError
from draftsmith.data import features
from draftsmith.heads import DRAFTERS
from draftsmith.targets import load as target_mod
from draftsmith.train import checkpoint, parallel
from draftsmith.train.logging import MetricsLogger
from draftsmith.train.run_lock import RunLock


@dataclass
class TrainResult:
    output_dir: Path
    final_checkpoint: Path | None
    losses: list[float] = field(default_factory=list)  # one per optimizer step, from step 1
    last_metrics: dict = field(default_factory=dict)
    steps: int = 0


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lr_lambda(train_cfg, total_steps: int):
    """Linear warmup to lr, then cosine decay to lr * min_lr_ratio at total_steps."""

    def factor(step: int) -> float:
        if step < train_cfg.warmup_steps:
            return (step + 1) / max(1, train_cfg.warmup_steps)
        progress = min(1.0, (step - train_cfg.warmup_steps) / max(1, total_steps - train_cfg.warmup_steps))
        return train_cfg.min_lr_ratio + (1 - train_cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return factor


def resolve_precision(precision: str, device: torch.device) -> str:
    if precision == "auto":
        return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    return precision


def autocast_for(precision: str, device: torch.device):
    precision = resolve_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def grad_scaler_for(train_cfg, device: torch.device):
    """fp16 gradients underflow without loss scaling: fp16 gets torch's dynamic GradScaler (steps
    with inf/nan gradients are skipped and the scale lowered). bf16 and fp32 need none (None)."""
    if resolve_precision(train_cfg.precision, device) != "fp16":
        return None
    if train_cfg.backend in ("fsdp2", "deepspeed"):
        raise UserError(f"train.precision=fp16 is not supported with train.backend={train_cfg.backend} "
                         "(no sharded gradient scaler here); use train.precision=bf16 or fp32")
    return torch.amp.GradScaler(device.type)


def with_prompt_loss(batch: dict) -> dict:
    """train.loss_on_prompt: the batch with every real position in its loss mask (the prompt's target labels too)."""
    return {**batch, "loss_mask": batch["attention_mask"].to(batch["loss_mask"].dtype, copy=True)}


def pool_metrics(parts: list[tuple[dict, dict, float]]) -> dict[str, tuple[float, float]]:
    """[(metrics, weights, num_tokens)] -> {key: (sum of value * weight, sum of weight)}."""
    pooled: dict[str, tuple[float, float]] = {}
    for metrics, weights, num_tokens in parts:
        for key, value in metrics.items():
            w = float(weights.get(key, num_tokens))
            total, weight = pooled.get(key, (0.0, 0.0))
            pooled[key] = (total + float(value) * w, weight + w)
    return pooled


def pooled_means(pooled: dict[str, tuple[float, float]]) -> dict[str, float]:
    return {key: total / weight if weight > 0 else 0.0 for key, (total, weight) in pooled.items()}


def load_data(cfg, target, drafter_cls, options, ctx=None, api_key_env: str | None = None):
    """-> (train_set, heldout_set, token_counts) for online or offline features.

    Under several ranks (ctx), rank 0 alone regenerates answers and prints the data report.
    api_key_env: the variable holding the regeneration server's key (--api-key-env)."""
    from draftsmith import data

    if cfg.features.mode == "offline" and cfg.features.source == "vllm":  # vLLM's hidden-states files
        from draftsmith.data import vllm_hidden_states

        train, heldout, report = data.build_dataset(data.training_data_config(cfg), target.tokenizer,
                                                    getattr(target, "processor", None))
        log = print if ctx is None or ctx.is_main else (lambda *_: None)
        layers = drafter_cls.feature_layers_for(options, target)
        train_set, heldout = vllm_hidden_states.open_rows(cfg.features.dir, target, layers, drafter_cls.required_features,
                                                          [train, heldout], log=log)
        return train_set, heldout, data.token_counts(train_set, target.vocab_size)
    if cfg.features.mode == "offline":
        from draftsmith.data import feature_cache

        layers = drafter_cls.feature_layers_for(options, target)
        rows = feature_cache.open(cfg.features.cache_dir, target, layers, drafter_cls.required_features,
                                  cfg.features.label_topk)  # label_topk: rows carry the top-K logits
        n_train = len(rows) - cfg.data.eval_samples  # the cache holds train rows first, then heldout rows
        train_set, heldout = rows.subset(0, n_train), rows.subset(n_train, len(rows))
        return train_set, heldout, data.token_counts(train_set, target.vocab_size)
    if cfg.data.streaming:  # rows read lazily (data/streaming.py); the report fills as training reads them
        from draftsmith.data import streaming

        streaming.check(cfg)
        source, heldout, _ = streaming.open_stream(data.training_data_config(cfg), target.tokenizer)
        return source, heldout, streaming.token_counts(source, target.vocab_size)
    if cfg.regenerate.output:
        # Answers regenerated by the target itself (resumable: finished rows are kept and skipped).
        from draftsmith.data.regenerate import regenerate_for_recipe

        if ctx is None or ctx.is_main:
            regenerate_for_recipe(cfg, target, limit=cfg.regenerate.limit, api_key_env=api_key_env)
        if ctx is not None:
            ctx.barrier()
    train_set, heldout, report = data.build_dataset(data.training_data_config(cfg), target.tokenizer,
                                                    getattr(target, "processor", None))
    if train_set.media is not None and cfg.data.pack_length:
        raise UserError("data.pack_length packs several rows into one, and this data has rows with images (a row's "
                        "images go with its own sequence): unset data.pack_length")
    if train_set.media is not None and cfg.train.loss_on_prompt:
        raise UserError("train.loss_on_prompt trains every position of a row, and this data has rows with images, whose "
                        "image tokens carry no label: unset train.loss_on_prompt")
    if ctx is None or ctx.is_main:
        print(report.summary(), flush=True)
    if len(train_set) == 0:
        raise UserError(f"data.path {cfg.data.path}: no usable rows (see the summary above)")
    return train_set, heldout, data.token_counts(train_set, target.vocab_size)


def move(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


class Trainer:
    """State of one run; `run()` is the loop, `_train_step()` one optimizer step."""

    def __init__(self, cfg, target=None, overwrite: bool = False, api_key_env: str | None = None):
        self.cfg = cfg
        self.output_dir = Path(cfg.train.output_dir)
        # one training per output_dir at a time (rank 0 holds the lock until run() ends)
        self.lock = RunLock.acquire(self.output_dir) if int(os.environ.get("RANK", "0")) == 0 else None
        try:
            self._setup(cfg, target, overwrite, api_key_env)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Let another training use output_dir (run() calls it at its end)."""
        if getattr(self, "lock", None) is not None:
            self.lock.release()

    def _setup(self, cfg, target, overwrite: bool, api_key_env: str | None) -> None:
        tc = cfg.train
        device = target_mod.resolve_device(cfg.target.device)
        self.resume_path = self._resume_path()
        self._claim_output_dir(overwrite)
        self.ctx = parallel.setup(tc, device)
        # Every rank has checked output_dir before rank 0 writes in it (metrics.jsonl below): torch's
        # init_process_group no longer waits for all ranks, so a slow rank would find rank 0's new log
        # and refuse the directory as another run's.
        self.ctx.barrier()
        self.scaler = grad_scaler_for(tc, self.ctx.device)
        seed_everything(tc.seed)
        if target is None and tc.target_sharding == "fsdp2":  # meta-device load: no rank holds the whole target
            from draftsmith.train.sharded_load import load_target_sharded

            self.target = load_target_sharded(self.ctx, cfg.target)
        else:
            self.target = target or target_mod.from_config(cfg.target)
            if tc.target_sharding == "fsdp2":
                parallel.shard_target(self.ctx, self.target)
        from draftsmith.heads import check_for_training

        drafter_cls = DRAFTERS.get(cfg.drafter.kind)
        options = cfg.drafter.options
        check_for_training(self.target, cfg.drafter.kind, options)  # `draftsmith inspect`'s refusals, before any data
        check_positions(cfg, options, self.target)
        from draftsmith.train import workload_eval

        asked = workload_eval.prompts(tc.workload_eval)  # a bad workload is named before any data is read
        self.train_set, self.heldout, counts = load_data(cfg, self.target, drafter_cls, options, self.ctx, api_key_env)
        # train.workload_eval: the loop's own contexts, measured beside the held-out rows
        self.workload_sets = workload_eval.build(self.target, cfg, asked, print if self.ctx.is_main else (lambda *_: None))
        self.workload_eval_s = 0.0  # the last evaluation's seconds on them
        if cfg.data.pack_length:  # several documents per row (counts above are per document, unchanged)
            from draftsmith.data.packing import PackedDataset

            self.train_set = PackedDataset(self.train_set, cfg.data.pack_length)
        self.drafter = drafter_cls.from_target(options, self.target, counts)
        if tc.init_from:
            checkpoint.load_init_weights(Path(tc.init_from), self.drafter, self.target)  # checkpoint or export dir
        from draftsmith.heads import draft_layer

        draft_layer.configure(self.drafter, tc.ttt_attention, tc.gradient_checkpointing)
        if tc.compile:
            self.drafter.compile(backend=tc.compile)  # in place: state_dict keys and wrappers unchanged
        self.required = set(self.drafter.required_features)
        self.layers = self.drafter.feature_layers()
        workload_eval.keep_features(self.workload_sets, self.target, self.required, self.layers,  # once
                                    self.target.tokenizer.pad_token_id or 0)
        from draftsmith.data.streaming import batch_stream

        pad_id = self.target.tokenizer.pad_token_id or 0
        self.stream = batch_stream(self.train_set, tc.batch_size, tc.seed, self.ctx.rank, self.ctx.world_size, pad_id,
                                   cfg.data.shuffle_buffer)
        per_step = tc.batch_size * tc.grad_accum * self.ctx.world_size
        self.total_steps = tc.max_steps or max(1, math.ceil(len(self.train_set) / per_step) * tc.epochs)
        # The backend wraps the drafter (DDP / FSDP2 / DeepSpeed engine) and builds the optimizer on its parameters.
        self.model, self.optimizer = self.ctx.wrap(self.drafter, lambda params: torch.optim.AdamW(
            params, lr=tc.lr, betas=tuple(tc.betas), weight_decay=tc.weight_decay))
        if self.ctx.world_size > 1:
            seed_everything(tc.seed + self.ctx.rank)  # same init on every rank (above), own random stream from here
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(tc, self.total_steps))
        self.autocast = autocast_for(tc.precision, self.ctx.device)
        self.step = 0
        self.tokens_seen = 0.0  # training tokens (padding excluded, all ranks) so far: the learning curve's x
        self.losses: list[float] = []
        self.logger = MetricsLogger(cfg.logging, self.output_dir, config_mod.to_dict(cfg), self.ctx.rank)

    # ------------------------------------------------------------------ output directory
    def _resume_path(self) -> Path | None:
        resume = self.cfg.train.resume
        if resume is True:
            return checkpoint.resume_point(self.output_dir)
        return Path(resume) if resume else None

    def _claim_output_dir(self, overwrite: bool) -> None:
        """A fresh run never writes over another run's checkpoints: it needs an output_dir without
        them, a resume, or overwrite (which deletes the old run's checkpoints and logs first)."""
        old = checkpoint.previous_run(self.output_dir)
        if not old or self.resume_path is not None:
            return
        if not overwrite:
            held = f"{', '.join(old[:4])}{', ...' if len(old) > 4 else ''}"
            how = (f"train.resume=true found no step checkpoint there: resume from a path "
                   f"(train.resume={self.output_dir / 'final'})" if self.cfg.train.resume is True
                   else "continue it with train.resume=true")
            raise FileExistsError(
                f"train.output_dir {self.output_dir} already holds a run ({held}): {how}, start over with "
                "--overwrite (deletes those files), or set train.output_dir to a new directory")
        if int(os.environ.get("RANK", "0")) == 0:
            print(f"--overwrite: removing {', '.join(old)} from {self.output_dir}", flush=True)
            checkpoint.clear_previous_run(self.output_dir)

    # ------------------------------------------------------------------ state
    def trainer_state(self) -> dict:
        """Collective (every rank calls it); the full state is meaningful on rank 0."""
        rng = self.ctx.all_gather_object(checkpoint.rng_state())  # one RNG state per rank
        return {"step": self.step, "optimizer": self.ctx.optimizer_state_dict(self.drafter, self.optimizer),
                "scheduler": self.scheduler.state_dict(), "data": self.stream.state_dict(), "rng": rng[0],
                "rng_per_rank": rng, "world_size": self.ctx.world_size, "backend": self.ctx.backend,
                "losses": list(self.losses), "lr": self.cfg.train.lr, "tokens_seen": self.tokens_seen,
                "total_steps": self.total_steps,
                "grad_scaler": self.scaler.state_dict() if self.scaler is not None else None}

    def resume_from(self, path: Path) -> None:
        state = checkpoint.load_trainer_state(path)
        check_trainer_state(path, state)
        saved_world = state.get("world_size", 1)
        if saved_world != self.ctx.world_size:
            raise UserError(f"{path} was written by {saved_world} rank(s), this run has {self.ctx.world_size}: resume "
                             "needs the same world size; warm start from its weights with train.init_from instead")
        self.ctx.load_model_state(self.drafter, ckpt_io.read_weights(path))
        self.ctx.load_engine_state(path)  # DeepSpeed: weights + ZeRO optimizer partitions
        self.ctx.load_optimizer_state(self.drafter, self.optimizer, state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.stream.load_state_dict(state["data"])
        checkpoint.set_rng_state(state.get("rng_per_rank", [state["rng"]])[self.ctx.rank], f"{path}/trainer_state.pt")
        self.step, self.losses = state["step"], list(state["losses"])
        self.tokens_seen = float(state.get("tokens_seen", 0.0))  # 0 for a checkpoint from before it was kept
        if self.scaler is not None and state.get("grad_scaler"):
            self.scaler.load_state_dict(state["grad_scaler"])
        self._apply_lr(path, state)
        self._apply_schedule_length(path, state)
        self.logger.rewind(self.step)  # metrics.jsonl: drop the steps after the checkpoint (they are redone)
        self.logger.info(f"resumed from {path} at step {self.step}")

    def _apply_lr(self, path: Path, state: dict) -> None:
        """The optimizer and scheduler states restore the checkpoint's base lr; a recipe that changed
        train.lr gets its new lr from here on (on the same warmup/cosine schedule position)."""
        lr = self.cfg.train.lr
        old = state.get("lr", self.scheduler.base_lrs[0])
        if all(abs(b - lr) <= 1e-12 * max(1.0, abs(lr)) for b in self.scheduler.base_lrs):
            return
        self.scheduler.base_lrs = [lr for _ in self.scheduler.base_lrs]
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
        self._lr_from_schedule()
        self.logger.info(f"train.lr changed from {old:g} (checkpoint {path}) to {lr:g}: applied from step "
                         f"{self.step + 1} (this step's lr {self.optimizer.param_groups[0]['lr']:.3g})")

    def _lr_from_schedule(self) -> None:
        """Set each group's lr to this run's schedule at the resumed step (the optimizer state holds the
        checkpoint's, which a changed train.lr or step count makes stale)."""
        factors = [f(self.scheduler.last_epoch) for f in self.scheduler.lr_lambdas]
        for group, base, factor in zip(self.optimizer.param_groups, self.scheduler.base_lrs, factors):
            group["lr"] = base * factor
        self.scheduler._last_lr = [g["lr"] for g in self.optimizer.param_groups]

    def _apply_schedule_length(self, path: Path, state: dict) -> None:
        """A resume with another step count than the checkpoint's puts the warmup/cosine schedule around the resumed
        step on the new length. The optimizer state brought back the old schedule's lr for the next step: replace it
        with the new schedule's (as _apply_lr does for a new train.lr), and say how the lr moved. Checkpoints from
        before the step count was kept say nothing here."""
        saved = state.get("total_steps")
        if not isinstance(saved, int) or saved == self.total_steps or self.step >= self.total_steps:
            return
        self._lr_from_schedule()
        tc = self.cfg.train
        was = float(state.get("lr", tc.lr)) * lr_lambda(tc, saved)(self.step)
        now = self.optimizer.param_groups[0]["lr"]
        if abs(now - was) <= 1e-3 * max(now, was):  # inside the warm-up: both schedules agree here
            return
        how = ("raises the lr again: stretching a finished cosine trained worse than one schedule over every step"
               if now > was else "lowers the lr")
        self.logger.info(f"{path} trained on a schedule that ends at step {saved:,}; this run's ends at step "
                         f"{self.total_steps:,}: step {self.step + 1:,} runs at lr {now:.3g}, not {was:.3g}. This "
                         f"{how} (docs/training.md \"Training longer\")")

    def save(self, name: str) -> Path | None:
        """Collective: every rank takes part (sharded states are gathered); rank 0 writes the files."""
        from safetensors import SafetensorError

        weights = self.ctx.model_state_dict(self.drafter)
        state = self.trainer_state()
        try:  # written aside and renamed into place: a failed write leaves every older checkpoint as it was
            path = checkpoint.save_collective(self.ctx, self.output_dir / name, self.drafter, self.target, self.cfg,
                                              self.step, state, weights)
        except (OSError, SafetensorError, UserError) as exc:  # a full disk, a quota
            if isinstance(exc, UserError):  # files.disk_full_guard's line: report the write that failed under it
                if exc.__cause__ is None:
                    raise
                exc = exc.__cause__
            kept = checkpoint.latest(self.output_dir)
            how = (f"the last checkpoint {kept} is kept: free space and rerun with train.resume=true" if kept else
                   "no earlier checkpoint exists (train.save_every > 0 keeps step checkpoints to resume from)")
            raise UserError(f"train: could not write the checkpoint {self.output_dir / name} at step {self.step} "
                            f"({' '.join(str(exc).split())[:200]}); {how}") from exc
        if self.ctx.is_main:
            checkpoint.rotate(self.output_dir, self.cfg.train.keep_last)
        self.ctx.barrier()
        return path

    # ------------------------------------------------------------------ one optimizer step
    def _train_step(self) -> dict:
        """-> this step's metrics; values may be device tensors (read on the host at log steps only)."""
        tc = self.cfg.train
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
        tokens = torch.zeros((), dtype=torch.float64)
        seen_tokens, t_target, t_drafter = 0, 0.0, 0.0
        parts: list[tuple[dict, dict, float]] = []
        for micro in range(tc.grad_accum):  # 1.
            t0 = time.perf_counter()
            raw = next(self.stream)
            seen_tokens += int(raw["attention_mask"].sum())  # counted on the host, before the copy
            batch = move(raw, self.ctx.device)
            batch = features.complete(self.target, batch, self.required, self.layers)
            if tc.loss_on_prompt:
                batch = with_prompt_loss(batch)
            t1 = time.perf_counter()
            with self.ctx.accumulate(last=micro == tc.grad_accum - 1):  # ranks sync gradients on the last only
                with self.autocast():
                    out = self.model(batch)
                self.ctx.backward(self.scaler.scale(out.loss) if self.scaler is not None else out.loss)
            t_target, t_drafter = t_target + t1 - t0, t_drafter + time.perf_counter() - t1
            loss_sum += out.loss.detach().double()  # stays on the device (no host sync per micro-batch)
            tokens += out.num_tokens
            parts.append((out.metrics, out.weights, float(out.num_tokens)))
        seen = torch.tensor(float(seen_tokens), dtype=torch.float64)
        if self.ctx.world_size > 1:  # 2. one collective; its result is needed on the host for the scaling
            totals = self.ctx.all_reduce_sum(torch.stack([loss_sum.cpu(), tokens, seen]))
            loss_total, global_tokens, global_seen = totals[0], float(totals[1]), float(totals[2])
            rank_parts = self.ctx.all_gather_object(pool_metrics(parts))  # metrics weighted by tokens, all ranks
        else:  # single process: the counts are host numbers already, the loss stays on the device
            loss_total, global_tokens, global_seen = loss_sum, float(tokens), float(seen)
            rank_parts = [pool_metrics(parts)]
        pooled: dict[str, tuple[float, float]] = {}
        for rank_pooled in rank_parts:
            for key, (total, weight) in rank_pooled.items():
                pooled[key] = (pooled.get(key, (0.0, 0.0))[0] + total, pooled.get(key, (0.0, 0.0))[1] + weight)
        sums = pooled_means(pooled)
        grad_norm = self.ctx.optimizer_step(self.optimizer, self.drafter.trainable_parameters(),  # 2. + 3.
                                            global_tokens, tc.max_grad_norm, self.scaler)
        self.scheduler.step()
        self.tokens_seen += global_seen
        elapsed = t_target + t_drafter
        return {"loss": loss_total / max(global_tokens, 1.0), **sums, "lr": self.scheduler.get_last_lr()[0],
                "grad_norm": grad_norm, "tokens_per_s": seen_tokens / max(elapsed, 1e-9),  # per device
                "tokens_per_s_total": global_seen / max(elapsed, 1e-9),
                "target_share": t_target / max(elapsed, 1e-9), "epoch": self.stream.epoch,
                "tokens_seen": self.tokens_seen}

    @torch.no_grad()
    def evaluate(self) -> dict[str, float]:
        """Mean loss and per-position metrics on the held-out rows (eval_*) and on each train.workload_eval
        workload's rows (eval_<workload>/*), no gradient."""
        from draftsmith.report.learning_curve import metric_name

        self.drafter.eval()
        results = ({f"eval_{k}": v for k, v in self._measure(self.heldout).items()}
                   if self.heldout is not None and len(self.heldout) else {})
        start = time.perf_counter()
        for w in self.workload_sets:  # train.workload_eval: the target's own answers to each workload's prompts
            results.update({metric_name(w.name, k): v for k, v in self._measure(w.rows).items()})
        self.workload_eval_s = time.perf_counter() - start
        self.drafter.train()
        return results

    def _measure(self, rows) -> dict[str, float]:
        """{"loss", "acc_0", ...}: the drafter's mean loss and per-position metrics on rows (weighted by tokens)."""
        from draftsmith.data import collate

        parts, loss, tokens = [], 0.0, 0
        pad_id = self.target.tokenizer.pad_token_id or 0
        for start in range(0, len(rows), self.cfg.train.batch_size):
            items = [rows[i] for i in range(start, min(len(rows), start + self.cfg.train.batch_size))]
            batch = features.complete(self.target, move(collate(items, pad_id), self.ctx.device), self.required, self.layers)
            out = self.drafter(batch)
            loss, tokens = loss + float(out.loss), tokens + out.num_tokens
            parts.append((out.metrics, out.weights, float(out.num_tokens)))
        return {"loss": loss / max(tokens, 1), **pooled_means(pool_metrics(parts))}  # weighted as in training

    # ------------------------------------------------------------------ the loop
    def run(self, stop_after: int | None = None) -> TrainResult:
        try:
            return self._run(stop_after)
        finally:
            self.release()

    def _run(self, stop_after: int | None) -> TrainResult:
        tc = self.cfg.train
        if self.ctx.is_main:
            stale = checkpoint.clean_stale_tmp(self.output_dir)  # interrupted checkpoint writes
            if stale:
                self.logger.info(f"removed {len(stale)} unfinished checkpoint write(s) from {self.output_dir}: {stale}")
        self.ctx.barrier()
        resume = self.resume_path
        if resume is not None:
            self.resume_from(resume)
        self.logger.info(f"training {self.drafter.kind} for {self.total_steps} steps "
                         f"({sum(p.numel() for p in self.drafter.trainable_parameters()):,} trainable params) -> {self.output_dir}")
        if self.ctx.distributed:
            self.logger.info(parallel.describe(self.ctx))
        self.drafter.train()
        metrics: dict = {}
        pending: list[dict] = []  # steps whose metrics are still on the device
        self.logger.start_progress(self.total_steps, self.step)
        while self.step < self.total_steps:
            pending.append(self._train_step())
            self.step += 1
            log_now = self.step % max(1, tc.log_every) == 0 or self.step == self.total_steps
            save_now = tc.save_every and self.step % tc.save_every == 0
            stop_now = stop_after is not None and self.step >= stop_after
            eval_now = bool(tc.eval_every and ((self.heldout is not None and len(self.heldout)) or self.workload_sets)
                            and self.step % tc.eval_every == 0)
            metrics = {}
            if log_now or save_now or stop_now or eval_now:  # the one host read of these steps' metrics
                host = to_host(pending)
                pending = []
                self._check_finite(host)  # before anything of these steps is logged or saved
                self.losses.extend(m["loss"] for m in host)
                metrics = host[-1]
            self.logger.advance(metrics)
            if eval_now:
                metrics.update(self.evaluate())
            if log_now or eval_now:  # a held-out evaluation is always logged (the learning curve reads it)
                self.logger.log(self.step, metrics)
            if eval_now and self.ctx.is_main:
                from draftsmith.report.learning_curve import train_line

                line = train_line(self.output_dir)  # `draftsmith plan RUN`'s one line, once 4 evaluations exist
                if line:
                    self.logger.info(line)
                if self.workload_sets:
                    from draftsmith.train.workload_eval import tau_line

                    self.logger.info(f"{tau_line(metrics, self.workload_sets)} ({self.workload_eval_s:.0f} s)")
            if tc.save_every and self.step % tc.save_every == 0 and self.step < self.total_steps:
                self.save(f"{checkpoint.STEP_PREFIX}{self.step:07d}")
            if stop_after is not None and self.step >= stop_after:
                self.logger.close()
                self.ctx.barrier()
                return TrainResult(self.output_dir, None, list(self.losses), metrics, self.step)
        final = self.save("final")
        self.logger.info(f"final checkpoint: {final}")
        self.logger.close()
        return TrainResult(self.output_dir, final, list(self.losses), metrics, self.step)


    def _check_finite(self, host: list[dict]) -> None:
        """Stop at a loss (or, without a gradient scaler, a gradient norm) that is NaN or infinite: the
        weights are ruined from that step on, so nothing more is saved."""
        first = self.step - len(host) + 1
        for i, m in enumerate(host):
            bad = [k for k in ("loss", "grad_norm") if k in m and isinstance(m[k], float) and not math.isfinite(m[k])
                   and (k == "loss" or self.scaler is None)]  # fp16's scaler skips steps with inf gradients itself
            if bad:
                self.logger.close()
                kept = checkpoint.latest(self.output_dir) if self.ctx.is_main else None
                raise TrainingDivergedError(
                    f"train: the {bad[0]} became {m[bad[0]]} at step {first + i} (train.lr={self.cfg.train.lr:g}); "
                    f"stopped without saving. {f'The last good checkpoint is {kept}' if kept else 'No checkpoint was saved'}"
                    "; lower train.lr or train.max_grad_norm, or check the data, then rerun")


class TrainingDivergedError(UserError):
    """The loss turned NaN or infinite; the run stops and keeps its last good checkpoint."""


def check_positions(cfg, options, target) -> None:
    """Rows and drafting blocks must fit the target's positions (a longer row runs past its rope table)."""
    from draftsmith.targets.archs import text_config

    limit = getattr(text_config(target.config), "max_position_embeddings", None)  # a VLM: its language model's
    if not isinstance(limit, int):
        return
    for key, value in (("data.max_length", cfg.data.max_length), ("data.pack_length", cfg.data.pack_length),
                       ("drafter.block_size", getattr(options, "block_size", None))):
        if isinstance(value, int) and value > limit:
            raise UserError(f"{key}={value:,} is past the target's {limit:,} positions ({target.name}); "
                            f"set {key} <= {limit}")


def check_trainer_state(path: Path, state) -> None:
    """A received trainer_state.pt must hold what resume reads, with a step that is a count."""
    file = Path(path) / "trainer_state.pt"
    if not isinstance(state, dict):
        raise UserError(f"{file}: not a trainer state (a {type(state).__name__}); the checkpoint is damaged")
    missing = [k for k in ("step", "optimizer", "scheduler", "data", "rng", "losses") if k not in state]
    if missing:
        raise UserError(f"{file}: missing {missing}; the checkpoint is damaged (warm start from its weights with "
                        "train.init_from instead)")
    step = state["step"]
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise UserError(f"{file}: step {step!r:.40} is not a step count (an integer >= 0); the checkpoint is damaged")
    if not isinstance(state["losses"], list):
        raise UserError(f"{file}: losses is not a list; the checkpoint is damaged")


def to_host(steps: list[dict]) -> list[dict]:
    """Metrics of several steps -> plain floats, with ONE device-to-host copy for all tensors."""
    tensors = [v for m in steps for v in m.values() if torch.is_tensor(v)]
    values = iter(torch.stack([t.detach().double().reshape(()) for t in tensors]).cpu().tolist() if tensors else [])
    return [{k: next(values) if torch.is_tensor(v) else v for k, v in m.items()} for m in steps]


def train(cfg, target=None, stop_after: int | None = None, overwrite: bool = False,
          api_key_env: str | None = None) -> TrainResult:
    """Train the drafter a recipe describes; returns losses and the final checkpoint path.

    overwrite: start over in an output_dir that holds another run (its checkpoints and logs are
    deleted); api_key_env: the variable holding the regeneration server's key (--api-key-env)."""
    return Trainer(cfg, target, overwrite=overwrite, api_key_env=api_key_env).run(stop_after=stop_after)
