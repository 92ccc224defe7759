"""What several drafter kinds share: the aux feature layers (one bounds rule), the reduced draft
vocabulary, and a named reference to a frozen module that must stay out of parameters() and
state_dict() (the target's embedding, the target itself, the adapted teacher).

Aux layer ids (draftsmith, vLLM): id i is hidden_states[i], the INPUT of target decoder layer i,
so 0 <= i < num_layers. hidden_states[num_layers] (after the final norm) is no decoder layer's
input and no engine captures it. Ids are unique and ascending: vLLM (`sorted(set(ids))`) and
TensorRT-LLM capture them sorted, so a drafter trained on [3, 1, 2] would be served its features
in another order.
"""
from __future__ import annotations

from typing import Generic, Optional, TypeVar

import torch

from draftsmith.core.errors import UserError
from draftsmith.targets.archs import default_aux_layer_ids

M = TypeVar("M")
WHERE = "drafter.aux_layer_ids"


def aux_layer_problems(ids: Optional[list[int]], where: str = WHERE) -> list[str]:
    """Config-time problems of an aux_layer_ids option (no target needed); [] when ids is None (the default)."""
    if ids is None:
        return []
    if not ids:
        return [f"{where}: give at least one target layer id (or null for low/mid/high)"]
    if any(not isinstance(i, int) or isinstance(i, bool) or i < 0 for i in ids):
        return [f"{where}: ids must be integers >= 0, got {ids!r}"]
    fixed = sorted(set(ids))
    if list(ids) != fixed:
        why = "repeat a layer" if len(fixed) < len(ids) else "are not ascending"
        return [f"{where} {list(ids)}: ids {why}; engines capture each layer once, in ascending order: "
                f"write them ascending and unique: {fixed}"]
    return []


def resolve_aux_layer_ids(ids: Optional[list[int]], num_layers: int, where: str = WHERE,
                          saved_before_the_rule: bool = False) -> list[int]:
    """The layer ids a drafter reads for a target of `num_layers` layers: the given ones, checked, or
    EAGLE-3's low/mid/high default. One rule for every kind: unique, ascending, 0 <= id < num_layers.

    saved_before_the_rule: an EAGLE-3 checkpoint trained when id == num_layers (the final post-norm
    state) was still accepted is rebuilt as it was trained (it loads and evaluates; export refuses it)."""
    if ids is None:
        return default_aux_layer_ids(num_layers)
    problems = aux_layer_problems(ids, where)
    if problems:
        raise UserError(problems[0])
    top = num_layers + 1 if saved_before_the_rule else num_layers
    bad = [i for i in ids if not 0 <= i < top]
    if bad:
        raise UserError(f"{where} {list(ids)}: ids must lie in 0..{num_layers - 1} for this {num_layers}-layer target "
                         f"(id i is the input of decoder layer i; {num_layers} would be the final, post-norm state, "
                         "which no engine captures); drop or lower " + ", ".join(map(str, bad)))
    return list(ids)


def draft_vocabulary(draft_vocab_size: Optional[int], vocab_size: int,
                     token_counts: Optional[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [dv], t2d [V]) of the reduced draft vocabulary: the dv most frequent target ids of the
    training data (data/draft_vocab.py); null keeps the full vocabulary."""
    from draftsmith.data import draft_vocab

    dv = draft_vocab_size or vocab_size
    if dv > vocab_size:
        raise UserError(f"drafter.draft_vocab_size {dv} exceeds the target vocabulary ({vocab_size}); "
                         f"use at most {vocab_size} or null")
    counts = token_counts if token_counts is not None else torch.zeros(vocab_size, dtype=torch.long)
    return draft_vocab.build(counts, dv)


def draft_ids_of(d2t: torch.Tensor) -> torch.Tensor:
    """[dv] target ids of a draft vocabulary from its d2t offsets (target_id = draft_id + d2t[draft_id])."""
    return torch.arange(len(d2t), device=d2t.device) + d2t


def draft_index_of(draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[V] target id -> its draft id, -1 outside the draft vocabulary."""
    index = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_ids.device)
    index[draft_ids] = torch.arange(len(draft_ids), device=draft_ids.device)
    return index


def on_target_vocab(values: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., dv] values over the draft vocabulary -> [..., V] over the target's, -inf outside it."""
    full = values.new_full((*values.shape[:-1], vocab_size), float("-inf"))
    full[..., draft_ids] = values
    return full


class Frozen(Generic[M]):
    """A reference to a frozen module a drafter uses but does not own: nn.Module does not register a
    Frozen attribute, so the module stays out of parameters(), state_dict(), .to() and DDP's buckets.
    `self.embed = Frozen(target.embed_tokens)`; call it like the module, or take `.module`."""

    __slots__ = ("module",)

    def __init__(self, module: M):
        self.module = module

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def __getitem__(self, index: int) -> M:
        """`ref[0]`: the module (as the `[module]` lists this replaces were read)."""
        if index != 0:
            raise IndexError("a Frozen reference holds one module: use [0] or .module")
        return self.module
