"""Hold the evaluation prompts out of training data, by text.

`draftsmith eval` and benchmarks/bench_real_target.py take the first N prompts of each workload
(`workloads.load(name, data_dir, N)`: file order, round-robin over categories for MT-bench and the
Spec-Bench tasks). The same question can sit in more than one file (Spec-Bench's MT-bench and GSM8K
parts copy those benchmarks), so rows are matched by their user text with whitespace collapsed, not
by file or row number.

    held = eval_prompt_texts(["humaneval", "gsm8k", "mt_bench", "alpaca", "spec_bench"], n=20)
    kept, dropped = without_heldout(rows, held)   # rows: [{"messages": [{"role": "user", ...}]}, ...]
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from draftsmith.eval import workloads


def normalize(text: str) -> str:
    """Whitespace collapsed and stripped: the key two copies of one prompt share."""
    return " ".join(text.split())


def eval_prompt_texts(names: Iterable[str], n: int, data_dir: Optional[Path] = None) -> set[str]:
    """The normalized prompt texts of the first n items of each workload (groups such as spec_bench expanded)."""
    held: set[str] = set()
    for name in workloads.expand(list(names)):
        held.update(normalize(item["prompt"]) for item in workloads.load(name, data_dir, n))
    return held


def user_text(row: dict) -> str:
    """The text of a row's first user turn (what the eval prompt of that row would be)."""
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


def without_heldout(rows: list[dict], held: set[str]) -> tuple[list[dict], list[dict]]:
    """rows -> (kept, dropped): a row is dropped when its first user turn equals a held-out prompt."""
    kept, dropped = [], []
    for row in rows:
        (dropped if normalize(user_text(row)) in held else kept).append(row)
    return kept, dropped
