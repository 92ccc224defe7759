"""Experiment tracking: console always, metrics.jsonl in the run directory always, and wandb /
tensorboard when the recipe's logging.report_to names them. Only rank 0 logs.
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
            print(f"step {step:>6} | loss {metrics.get('loss', float('nan')):.4f} | acc/pos [{accs}] | "
                  f"lr {metrics.get('lr', 0):.2e} | {metrics.get('tokens_per_s', 0):.0f} tok/s", file=sys.stdout, flush=True)
        if self._wandb is not None:
            self._wandb.log(metrics, step=step)
        if self._tb is not None:
            for key, value in metrics.items():
                if isinstance(value, (int, float)):
                    self._tb.add_scalar(key, value, step)

    def info(self, text: str) -> None:
        if self.enabled:
            print(text, flush=True)

    def close(self) -> None:
        if not self.enabled:
            return
        self._jsonl.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def _pos_key(name: str):
    tail = name.rsplit("_", 1)[-1]
    return (name.rsplit("_", 1)[0], int(tail) if tail.isdigit() else 0)
