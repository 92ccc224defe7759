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
Both equal the straightforward computation (tests/unit/test_vocab_loss.py).

    p, top = soft_labels(batch["target_logits"], draft_ids)           # [b, s, dv] fp32, [b, s]
    kl_sum, hits = chunked_kl(hidden, lambda h: lm_head(norm(h)), p_t, mask_t, draft_ids, top_t)
"""
from __future__ import annotations

from typing import Callable

import torch
from torch.utils.checkpoint import checkpoint

DEFAULT_CHUNK = 1024


def soft_labels(target_logits: torch.Tensor, draft_ids: torch.Tensor, chunk: int = DEFAULT_CHUNK):
    """[b, s, V] target logits (any dtype) -> (p [b, s, dv] fp32 softmax over the draft vocabulary,
    top [b, s] the target's argmax over the FULL vocabulary, as target ids). No [b, s, V] fp32 copy:
    the draft columns are gathered in the logits' own dtype, one sequence chunk at a time."""
    b, s, _ = target_logits.shape
    p = torch.empty(b, s, len(draft_ids), dtype=torch.float32, device=target_logits.device)
    top = torch.empty(b, s, dtype=torch.long, device=target_logits.device)
    with torch.no_grad():
        for a in range(0, s, chunk):
            part = target_logits[:, a : a + chunk]  # [b, c, V] (a view)
            p[:, a : a + chunk] = torch.softmax(part[..., draft_ids].float(), dim=-1)  # [b, c, V] -> [b, c, dv]
            top[:, a : a + chunk] = part.argmax(-1)
    return p, top


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


def _kl_block(head, hidden, p, mask, draft_ids, top):
    """One chunk: -> (sum of mask * KL(p || softmax(head(hidden))), top-1 hits under the mask)."""
    logq = torch.log_softmax(head(hidden).float(), dim=-1)  # [b, c, h] -> [b, c, dv]
    kl = (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1)  # [b, c]
    with torch.no_grad():
        hits = ((draft_ids[logq.argmax(-1)] == top).float() * mask).sum()
    return (kl * mask).sum(), hits


def chunked_kl(hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], p: torch.Tensor,
               mask: torch.Tensor, draft_ids: torch.Tensor, top: torch.Tensor, chunk: int = DEFAULT_CHUNK):
    """Forward KL(p || q) of one TTT step summed under the mask, q = softmax(head(hidden)).

    hidden [b, n, h]; head maps [b, c, h] -> [b, c, dv] draft logits (e.g. lm_head(norm(.)));
    p [b, n, dv] fp32 labels; mask [b, n]; top [b, n] the target's argmax (target ids).
    -> (kl_sum, differentiable scalar; hits, the masked count of draft argmax == top, no grad).
    With gradients on, each chunk runs under activation checkpointing: backward keeps the chunk's
    inputs only and recomputes its [b, c, dv] logits."""
    grad = torch.is_grad_enabled() and hidden.requires_grad
    kl_sum = hidden.new_zeros((), dtype=torch.float32)
    hits = hidden.new_zeros((), dtype=torch.float32)
    for a in range(0, hidden.shape[1], chunk):
        args = (head, hidden[:, a : a + chunk], p[:, a : a + chunk], mask[:, a : a + chunk], draft_ids,
                top[:, a : a + chunk])
        part, part_hits = checkpoint(_kl_block, *args, use_reentrant=False) if grad else _kl_block(*args)
        kl_sum, hits = kl_sum + part, hits + part_hits
    return kl_sum, hits
