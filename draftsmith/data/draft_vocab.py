"""Reduced draft vocabulary (EAGLE-3, Li et al. 2025): the drafter predicts only the dv most
frequent target tokens of its training data.

Convention (SGLang / vLLM): target_id = draft_id + d2t[draft_id]; t2d is a bool mask over the
target vocabulary marking the kept ids. Kept ids are sorted ascending, so d2t is non-decreasing.
"""
from __future__ import annotations

from typing import Optional

import torch

from draftsmith.core.errors import UserError


def build(counts: torch.Tensor, draft_vocab_size: Optional[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """counts [V] -> (d2t LongTensor [dv], t2d BoolTensor [V]).

    1. Rank ids by count, descending, ties by the lower id (a stable sort over ids 0..V-1);
       unseen ids (count 0) therefore follow in id order, filling dv when fewer were seen.
    2. Keep the first dv, sort them ascending.
    3. d2t[i] = kept[i] - i; t2d[kept] = True.
    draft_vocab_size None or V keeps the full vocabulary (d2t all zeros).
    """
    V = counts.shape[0]
    dv = V if draft_vocab_size is None else int(draft_vocab_size)
    if not 0 < dv <= V:
        raise UserError(f"draft_vocab_size {draft_vocab_size} must be in 1..{V} (the target vocabulary) or null")
    order = torch.sort(-counts.long(), stable=True).indices  # step 1: [V] ids by count desc, ties by id
    kept = torch.sort(order[:dv]).values  # step 2: [dv] ascending target ids
    d2t = kept - torch.arange(dv)  # step 3
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[kept] = True
    return d2t.long(), t2d


def check(d2t: torch.Tensor, t2d: torch.Tensor) -> None:
    """Raise ValueError unless t2d marks exactly the ids d2t maps to (target = draft + d2t[draft])."""
    dv = d2t.shape[0]
    if t2d.dtype != torch.bool:
        raise UserError(f"t2d must be a bool mask over the target vocabulary, got dtype {t2d.dtype}")
    mapped = d2t.long() + torch.arange(dv)
    kept = torch.nonzero(t2d).flatten()
    if kept.shape[0] != dv or not torch.equal(kept, mapped):
        bad = "sizes differ" if kept.shape[0] != dv else f"first mismatch at draft id {int((kept != mapped).nonzero()[0])}"
        raise UserError(
            f"d2t/t2d disagree ({bad}): t2d marks {kept.shape[0]} target ids, d2t has {dv} entries; expected "
            "nonzero(t2d) == d2t + arange(dv) (target_id = draft_id + d2t[draft_id]); rebuild them with "
            "draftsmith.data.draft_vocab.build(counts, draft_vocab_size)"
        )
