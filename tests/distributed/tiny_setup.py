"""The tiny target, data and recipe shared by the distributed tests and their torchrun worker."""
from __future__ import annotations

import json
from pathlib import Path

from draftsmith import config
from draftsmith.testing import tiny_target

# Per-rank micro-batch 2, 2 accumulation steps, 2 ranks: 8 sequences per optimizer step
# (the single-process reference uses micro-batch 4 for the same global batch).
PER_RANK_BATCH = 2
GRAD_ACCUM = 2
STEPS = 4


def make_workdir(workdir: Path) -> Path:
    """Write the tiny target and a conversation file (answers of very different lengths)."""
    target = tiny_target(num_layers=3, hidden=32)
    target.model.save_pretrained(workdir / "target")
    target.tokenizer.save_pretrained(workdir / "target")
    rows = [{"conversations": [{"from": "human", "value": f"q{i} " + "ab" * (i % 4)},
                               {"from": "gpt", "value": f"answer {i}: " + "xyz " * (1 + (i * 7) % 11)}]}
            for i in range(32)]
    (workdir / "chat.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return workdir


def recipe(workdir: Path, out: str, *overrides: str, batch_size: int = PER_RANK_BATCH):
    raw = {"target": {"path": str(workdir / "target"), "device": "cpu"},
           "data": {"path": [str(workdir / "chat.jsonl")], "max_length": 48},
           "drafter": {"kind": "eagle3", "ttt_steps": 2, "draft_vocab_size": 100},
           "train": {"output_dir": str(workdir / out), "max_steps": STEPS, "batch_size": batch_size,
                     "grad_accum": GRAD_ACCUM, "lr": 3e-3, "warmup_steps": 1, "log_every": 1, "precision": "fp32",
                     "keep_last": 1},
           "logging": {"progress_bar": False, "report_to": ["console"]}}
    return config.from_dict(raw, overrides=list(overrides))
