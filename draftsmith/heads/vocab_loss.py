"""Memory-lean distillation loss over a reduced draft vocabulary (EAGLE-3, Li et al. 2025: the
draft head predicts over the dv most frequent target tokens; the label at each position is the
target's next-token distribution restricted to them).

Today's EAGLE-3 loss materialises [b, s, V] fp32 target logits (V = 128,256 for Llama 3: 0.5 MB
per token) and keeps [b, n, dv] fp32 logits and log-probabilities of every TTT step for backward.
Here:
  1. soft labels are restricted to the draft vocabulary BEFORE any fp32 copy, a sequence chunk at
     a time (`soft_labels`, or `soft_labels_from_hidden` straight from the target's final hidden
     state and lm_head rows, so the full-vocabulary logits never exist at all);
  2. the KL of one TTT step runs over sequence chunks, each chunk's draft logits recomputed in
     backward (activation checkpointing), so only one chunk of [chunk, dv] fp32 logits is alive.
Both equal the straightforward computation (tests/heads/test_vocab_loss.py).
With features.label_topk the batch's target_logits is the offline cache's top-K logits (a TopKLogits,
data/features.py) and `soft_labels` makes the labels from those K entries (`topk_soft_labels`): every kind
whose labels come from soft_labels / gathered_soft_labels (its class sets takes_topk_labels) trains on them
with no lm_head replay.

    p, top = soft_labels(batch["target_logits"], draft_ids)           # [b, s, dv] fp32, [b, s]
    kl_sum, hits = chunked_kl(hidden, lambda h: lm_head(norm(h)), p_t, mask_t, draft_ids, top_t)

Eagle3Drafter.forward_loss uses `soft_labels` and `chunked_loss` (drafter.loss_chunk); DFlash, DSpark
and P-EAGLE take their labels at chosen positions through `gathered_soft_labels`.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

from draftsmith.data.features import TopKLogits
from draftsmith.heads.shared import draft_index_of

DEFAULT_CHUNK = 1024


def soft_labels(target_logits: torch.Tensor | TopKLogits, draft_ids: torch.Tensor, chunk: int = DEFAULT_CHUNK,
                temperature: float = 1.0):
    """[b, s, V] target logits (any dtype) -> (p [b, s, dv] fp32 softmax over the draft vocabulary,
    top [b, s] the target's argmax over the FULL vocabulary, as target ids). No [b, s, V] fp32 copy:
    the draft columns are gathered in the logits' own dtype, one sequence chunk at a time.
    temperature: p = softmax(logits / temperature) (the argmax does not depend on it).
    A TopKLogits (the cached top-K logits, features.label_topk) gives `topk_soft_labels`."""
    if isinstance(target_logits, TopKLogits):
        return topk_soft_labels(target_logits, draft_ids, temperature)
    b, s, _ = target_logits.shape
    p = torch.empty(b, s, len(draft_ids), dtype=torch.float32, device=target_logits.device)
    top = torch.empty(b, s, dtype=torch.long, device=target_logits.device)
    with torch.no_grad():
        for a in range(0, s, chunk):
            part = target_logits[:, a : a + chunk]  # [b, c, V] (a view)
            logits = part[..., draft_ids].float()  # [b, c, V] -> [b, c, dv]
            p[:, a : a + chunk] = torch.softmax(logits if temperature == 1.0 else logits / temperature, dim=-1)
            top[:, a : a + chunk] = part.argmax(-1)
    return p, top


@torch.no_grad()
def topk_soft_labels(top_k: TopKLogits, draft_ids: torch.Tensor, temperature: float = 1.0):
    """The labels from the target's top-K logits: p [b, s, dv] fp32 = softmax(values / temperature) over the
    K entries the draft vocabulary holds (0 on every other draft id; a position none of whose K entries it
    holds gets p = 0 and its argmax no draft id, so it teaches nothing), top [b, s] = ids[..., 0], the
    target's argmax. With K = V these are soft_labels' dense labels (up to the float16 of the values)."""
    index = draft_index_of(draft_ids, top_k.vocab_size)[top_k.ids]  # [b, s, K] draft id of each entry, -1 outside
    kept = index >= 0
    logits = top_k.values.float() if temperature == 1.0 else top_k.values.float() / temperature
    w = torch.softmax(logits.masked_fill(~kept, float("-inf")), dim=-1).nan_to_num(0.0)  # [b, s, K]; no entry kept: 0
    p = torch.zeros(*index.shape[:-1], len(draft_ids), dtype=torch.float32, device=index.device)
    p.scatter_add_(-1, index.clamp_min(0), w)  # [b, s, K] -> [b, s, dv]; entries outside add 0 to draft id 0
    return p, top_k.ids[..., 0].long()


def gathered_soft_labels(target_logits: torch.Tensor | TopKLogits, positions: torch.Tensor, draft_ids: torch.Tensor,
                         chunk: int = DEFAULT_CHUNK):
    """Soft labels at chosen positions (block drafters: DFlash, DSpark, P-EAGLE): [b, s, V] target logits
    (any dtype), positions [b, Q] (may repeat) -> (p [b, Q, dv] fp32, top [b, Q] full-vocabulary argmax).
    The draft columns are restricted first, a sequence chunk at a time (`soft_labels`), then gathered:
    neither a [b, s, V] nor a [b, Q, V] fp32 copy exists (at V = 262,144 one would be 1 MiB per row)."""
    p, top = soft_labels(target_logits, draft_ids, chunk)  # [b, s, dv] fp32, [b, s]
    p = p.gather(1, positions[..., None].expand(-1, -1, p.shape[-1]))  # [b, s, dv] -> [b, Q, dv]
    return p, top.gather(1, positions)  # [b, Q]


def soft_labels_from_hidden(last_hidden: torch.Tensor, lm_head_weight: torch.Tensor, draft_ids: torch.Tensor,
                            chunk: int = DEFAULT_CHUNK):
    """The same labels from the target's own output path: [b, s, h] final (post-norm) hidden states
    and the frozen lm_head weight [V, h]. Draft-vocabulary logits come from the dv lm_head rows;
    the full-vocabulary argmax from one [b, chunk, V] block at a time."""
    b, s, _ = last_hidden.shape
    rows = lm_head_weight[draft_ids]  # [V, h] -> [dv, h]
    p = torch.empty(b, s, len(draft_ids), dtype=torch.float32, device=last_hidden.device)
    top = torch.empty(b, s, dtype=torch.long, device=last_hidden.device)
    with torch.no_grad():
        for a in range(0, s, chunk):
            h = last_hidden[:, a : a + chunk].to(lm_head_weight.dtype)
            p[:, a : a + chunk] = torch.softmax((h @ rows.T).float(), dim=-1)  # [b, c, h] -> [b, c, dv]
            top[:, a : a + chunk] = (h @ lm_head_weight.T).argmax(-1)  # [b, c, V] -> [b, c]
    return p, top


def _loss_block(head, hidden, p, mask, draft_ids, top, hard, in_vocab, hard_weight: float):
    """One chunk: -> (sum of mask * loss, top-1 hits under the mask); loss = (1-w) KL(p || q) + w CE(hard)."""
    logq = torch.log_softmax(head(hidden).float(), dim=-1)  # [b, c, h] -> [b, c, dv]
    loss = (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1)  # [b, c]
    if hard_weight > 0:
        ce = -logq.gather(-1, hard[..., None]).squeeze(-1) * in_vocab  # [b, c]; no draft id: no CE
        loss = (1 - hard_weight) * loss + hard_weight * ce
    with torch.no_grad():
        hits = ((draft_ids[logq.argmax(-1)] == top).float() * mask).sum()
    return (loss * mask).sum(), hits


def chunked_loss(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], p: torch.Tensor,
                 mask: torch.Tensor, draft_ids: torch.Tensor, top: torch.Tensor, chunk: int = DEFAULT_CHUNK,
                 hard: torch.Tensor | None = None, in_vocab: torch.Tensor | None = None, hard_weight: float = 0.0,
                 recompute: bool = True):
    """The loss of one TTT step summed under the mask: (1-w) KL(p || q) + w CE(hard), q = softmax(head(hidden)).

    hidden [b, n, h]; head maps [b, c, h] -> [b, c, dv] draft logits (e.g. lm_head(norm(.)));
    p [b, n, dv] fp32 labels; mask [b, n]; top [b, n] the target's argmax (target ids);
    with hard_weight w > 0: hard [b, n] the argmax's draft id and in_vocab [b, n] whether it has one.
    -> (loss_sum, differentiable scalar; hits, the masked count of draft argmax == top, no grad).
    With gradients on and recompute, each chunk runs under activation checkpointing: backward keeps
    the chunk's inputs only and recomputes its [b, c, dv] logits (recompute=False keeps them)."""
    if hard_weight > 0 and (hard is None or in_vocab is None):
        raise ValueError("chunked_loss: hard_weight > 0 needs hard and in_vocab")
    grad = recompute and torch.is_grad_enabled() and hidden.requires_grad
    loss_sum = hidden.new_zeros((), dtype=torch.float32)
    hits = hidden.new_zeros((), dtype=torch.float32)
    for a in range(0, hidden.shape[1], chunk):
        part = slice(a, a + chunk)
        args = (head, hidden[:, part], p[:, part], mask[:, part], draft_ids, top[:, part],
                None if hard is None else hard[:, part], None if in_vocab is None else in_vocab[:, part], hard_weight)
        value, part_hits = checkpoint(_loss_block, *args, use_reentrant=False) if grad else _loss_block(*args)
        loss_sum, hits = loss_sum + value, hits + part_hits
    return loss_sum, hits


def chunked_kl(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], p: torch.Tensor,
               mask: torch.Tensor, draft_ids: torch.Tensor, top: torch.Tensor, chunk: int = DEFAULT_CHUNK):
    """Forward KL(p || q) of one TTT step summed under the mask (`chunked_loss` with soft labels only)."""
    return chunked_loss(hidden, head, p, mask, draft_ids, top, chunk)
