"""Experiment tracking: console always, metrics.jsonl in the run directory always, and wandb /
tensorboard when the recipe's logging.report_to names them. Only rank 0 logs. A tqdm progress
bar with ETA runs on rank 0 when logging.progress_bar is true and stderr is a terminal.

Logged every train.log_every steps: loss, acc_i / loss_i (per position), lr, grad_norm,
tokens_per_s (per device), tokens_per_s_total (all ranks), target_share (share of the step
spent in the target forward; the rest is the drafter's forward + backward), epoch, tokens_seen
(training tokens so far, padding excluded, all ranks). Every held-out evaluation (train.eval_every)
is logged, with eval_loss and eval_acc_i: `draftsmith plan RUN` fits its learning curve to them.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path


class MetricsLogger:
    def __init__(self, log_cfg, output_dir: str | Path, resolved_config: dict, rank: int = 0):
        self.enabled = rank == 0
        self.report_to = list(log_cfg.report_to)
        self.output_dir = Path(output_dir)
        self._wandb = None
        self._tb = None
        self._bar = None
        self.progress_bar = bool(getattr(log_cfg, "progress_bar", False))
        if not self.enabled:
            return
        self.output_dir.mkdir(parents=True, exist_ok=True)
        self._jsonl = open(self.output_dir / "metrics.jsonl", "a")
        run_name = log_cfg.run_name or self.output_dir.name
        if "wandb" in self.report_to:
            import wandb

            os.environ.setdefault("WANDB_SILENT", "true")
            self._wandb = wandb.init(project=log_cfg.project, name=run_name, mode=log_cfg.wandb_mode,
                                     dir=str(self.output_dir), config=resolved_config)
        if "tensorboard" in self.report_to:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(self.output_dir / "tensorboard"))
            self._tb.add_text("config", "```\n" + json.dumps(resolved_config, indent=2) + "\n```")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": step, **{k: round(v, 6) if isinstance(v, float) else v for k, v in metrics.items()}}
        self._jsonl.write(json.dumps(record) + "\n")
        self._jsonl.flush()
        if "console" in self.report_to:
            accs = " ".join(f"{metrics[k]:.2f}" for k in sorted(metrics, key=_pos_key) if k.startswith("acc_"))
            line = (f"step {step:>6} | loss {metrics.get('loss', float('nan')):.4f} | acc/pos [{accs}] | "
                    f"lr {metrics.get('lr', 0):.2e} | gnorm {metrics.get('grad_norm', float('nan')):.3f} | "
                    f"{metrics.get('tokens_per_s', 0):.0f} tok/s/device | target {metrics.get('target_share', 0):.0%}")
            if self._bar is not None:
                self._bar.write(line, file=sys.stdout)
            else:
                print(line, file=sys.stdout, flush=True)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)

    def rewind(self, step: int) -> None:
        """After a resume at `step`: drop metrics.jsonl records of later steps (the killed run logged
        them after its last checkpoint; they are logged again), so every step appears once."""
        if not self.enabled:
            return
        path = self.output_dir / "metrics.jsonl"
        self._jsonl.close()
        kept = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue  # a torn last line of a killed run
            if isinstance(record, dict) and isinstance(record.get("step"), int) and record["step"] <= step:
                kept.append(line)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(k + "\n" for k in kept), encoding="utf-8")
        os.replace(tmp, path)
        self._jsonl = open(path, "a")

    def start_progress(self, total: int, initial: int = 0) -> None:
        """A progress bar with ETA on rank 0 (stderr must be a terminal; CI logs stay clean)."""
        if self.enabled and self.progress_bar and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True, file=sys.stderr)

    def advance(self, metrics: dict[str, float]) -> None:
        if self._bar is not None and "loss" in metrics:  # metrics reach the host at log steps only
            self._bar.set_postfix(loss=f"{metrics.get('loss', float('nan')):.4f}",
                                  tok_s=f"{metrics.get('tokens_per_s', 0):.0f}", refresh=False)
        if self._bar is not None:
            self._bar.update(1)

    def info(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def _pos_key(name: str):
    tail = name.rsplit("_", 1)[-1]
    return (name.rsplit("_", 1)[0], int(tail) if tail.isdigit() else 0)
