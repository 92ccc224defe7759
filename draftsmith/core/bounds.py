"""Bounds on the sizes a user or a received file may ask for: draft tokens per round (k), tree sizes.

Without them `export --num-speculative-tokens 100000`, a k inherited from drafter.ttt_steps=10000,
`profile --k-max 100000000` or a 10^6-node static tree run (or hang) for hours, and a k longer
than the target's context "validates" a draft no engine can run. Each check raises one line
naming the flag or key and the bound.

  k <= MAX_DRAFT_TOKENS            no engine verifies more per round, and acceptance decays
                                   geometrically: past a few dozen positions no draft token is accepted
  k + ROOM <= max positions        a round needs a prompt, the k drafts and the bonus token inside
                                   the target's max_position_embeddings
  tree nodes <= MAX_TREE_NODES     one verification forward over the tree (a dense attention mask)
  batch size <= MAX_BATCH_SIZE     requests decoded or timed together (profile --batches 10^9 asked
                                   for 568 GB before the first forward), sequences per training
                                   micro-batch (train.batch_size=10^12 failed to allocate after 51 s)
  grad_accum <= MAX_GRAD_ACCUM     micro-batches per optimizer step (10^12 ran until killed)
  repeats <= MAX_REPEATS           timed runs per prompt or grid point (eval / profile --repeats,
                                   eval --warmup: 10^12 ran until killed)
"""
from __future__ import annotations

import math

from draftsmith.core.errors import UserError

MAX_DRAFT_TOKENS = 64
MAX_TREE_NODES = 1024
MAX_TREE_TOPK = 64
MAX_BATCH_SIZE = 1024
MAX_GRAD_ACCUM = 1024
MAX_REPEATS = 1000
ROOM = 16  # positions a round needs besides the drafts: a short prompt and the bonus token


def target_positions(target_config) -> int | None:
    text = getattr(target_config, "get_text_config", None)  # a vision-language target: its text backbone's positions
    value = getattr(text() if callable(text) else target_config, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def check_draft_tokens(k, name: str, target_config=None, minimum: int = 1) -> int:
    """k as an int in minimum..the bound, else UserError naming `name` (a flag or recipe key)."""
    if isinstance(k, bool) or not isinstance(k, int):
        if isinstance(k, float) and math.isfinite(k) and k == int(k):
            k = int(k)
        else:
            raise UserError(f"{name} {k!r}: must be a whole number of draft tokens in {minimum}..{MAX_DRAFT_TOKENS}")
    if k < minimum:
        raise UserError(f"{name} {k}: must be >= {minimum}")
    if k > MAX_DRAFT_TOKENS:
        raise UserError(f"{name} {k}: at most {MAX_DRAFT_TOKENS} draft tokens per round (no engine verifies more, "
                        "and acceptance decays geometrically with the position); give a smaller value")
    limit = target_positions(target_config) if target_config is not None else None
    if limit is not None and k + ROOM > limit:
        raise UserError(f"{name} {k}: the target has {limit} positions, so at most {max(limit - ROOM, 0)} draft "
                        f"tokens fit in a round beside a prompt; give a smaller value")
    return k


def check_tree(depth: int, topk: int, budget: int, target_config=None) -> None:
    """--tree-depth / --tree-topk / --verify-budget bounds (one line naming the flag)."""
    check_draft_tokens(depth, "--tree-depth", target_config)
    if not 1 <= topk <= MAX_TREE_TOPK:
        raise UserError(f"--tree-topk {topk}: must lie in 1..{MAX_TREE_TOPK}")
    if not 1 <= budget <= MAX_TREE_NODES:
        raise UserError(f"--verify-budget {budget}: must lie in 1..{MAX_TREE_NODES} (draft nodes in one verification "
                        "forward)")
    limit = target_positions(target_config) if target_config is not None else None
    if limit is not None and budget + ROOM > limit:
        raise UserError(f"--verify-budget {budget}: the target has {limit} positions; at most {max(limit - ROOM, 0)} "
                        "tree nodes fit beside a prompt")


def check_batch_sizes(values, name: str) -> list[int]:
    """Batch sizes in 1..MAX_BATCH_SIZE, else UserError naming `name` (checked before anything loads)."""
    values = [values] if isinstance(values, int) else list(values)
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= MAX_BATCH_SIZE:
            raise UserError(f"{name} {v!r}: batch sizes must lie in 1..{MAX_BATCH_SIZE} (each request of a batch "
                            "holds its own cache); give a smaller value")
    return values


def check_count(value, name: str, bound: int, minimum: int = 1) -> int:
    """A count flag in minimum..bound, else UserError naming `name`."""
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= bound:
        shown = f"an integer of {len(str(abs(value)))} digits" if isinstance(value, int) and abs(value) > 10**30 \
            else repr(value)
        if isinstance(value, int) and not isinstance(value, bool) and value < minimum:
            raise UserError(f"{name} {shown}: must be >= {minimum}")
        raise UserError(f"{name} {shown}: must lie in {minimum}..{bound:,}; give a smaller value")
    return value
