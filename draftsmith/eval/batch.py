"""Batched decoding mechanics for the speculative loop (eval/loop.py BatchState): B requests share
one target KV cache whose rows have different valid lengths (ragged acceptance).

Layout: the cache is [B, kv, L, d] with every row's valid entries right-aligned (left padding);
`valid` [B, L] marks them. A verification forward feeds q new positions per row (padded drafts
included) with a 4D mask: each row sees its own valid entries and, causally, its own new tokens;
position ids continue each row's own length. After acceptance, `repack` gathers each row's kept
entries (old valid ones + accepted new ones) back to a right-aligned layout, so rejected and
padded positions leave the cache (per-row rollback by gather).
"""
from __future__ import annotations

import torch


def stack_caches(caches: list, config) -> tuple[object, torch.Tensor]:
    """Per-request DynamicCaches (batch 1 each, from per-request prefills) -> one left-padded
    batched DynamicCache and valid [B, L]."""
    from transformers import DynamicCache

    lengths = [c.get_seq_length() for c in caches]
    L = max(lengths)
    out = DynamicCache(config=config)
    for li in range(len(caches[0].layers)):
        ks, vs = [], []
        for c, n in zip(caches, lengths):
            k, v = c.layers[li].keys, c.layers[li].values  # [1, kv, n, d]
            pad = k.new_zeros(1, k.shape[1], L - n, k.shape[3])
            ks.append(torch.cat([pad, k], dim=2))
            vs.append(torch.cat([pad, v], dim=2))
        out.update(torch.cat(ks), torch.cat(vs), li)  # [B, kv, L, d]
    valid = torch.zeros(len(caches), L, dtype=torch.bool, device=caches[0].layers[0].keys.device)
    for r, n in enumerate(lengths):
        valid[r, L - n:] = True
    return out, valid


def verify_inputs(valid: torch.Tensor, q: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """valid [B, L] -> additive mask [B, 1, q, L + q] and position ids [B, q] for q new positions per
    row: a row sees its valid cache entries and its own new tokens causally."""
    B, L = valid.shape
    causal = torch.ones(q, q, dtype=torch.bool, device=valid.device).tril()
    seen = torch.cat([valid[:, None, :].expand(B, q, L), causal.expand(B, q, q)], dim=2)  # [B, q, L + q]
    mask = torch.zeros(seen.shape, dtype=dtype, device=valid.device).masked_fill(~seen, torch.finfo(dtype).min)
    positions = valid.sum(1, keepdim=True) + torch.arange(q, device=valid.device)  # [B, q]
    return mask[:, None], positions


def repack(cache, valid: torch.Tensor, keep_new: list[int]) -> torch.Tensor:
    """After a forward that appended q entries per row: keep each row's valid entries plus its first
    keep_new[r] new ones, right-aligned in a cache of length max(kept). Returns the new valid [B, L']."""
    B, L = valid.shape
    total = cache.get_seq_length()
    q = total - L
    dev = valid.device
    rows = []
    for r in range(B):
        old = valid[r].nonzero().flatten()
        new = torch.arange(L, L + min(keep_new[r], q), device=dev)
        rows.append(torch.cat([old, new]))
    width = max(len(x) for x in rows)
    index = torch.zeros(B, width, dtype=torch.long, device=dev)
    new_valid = torch.zeros(B, width, dtype=torch.bool, device=dev)
    for r, x in enumerate(rows):
        index[r, width - len(x):] = x  # left padding repeats entry 0, masked by new_valid
        new_valid[r, width - len(x):] = True
    for layer in cache.layers:
        g = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])  # [B, kv, L', d]
        layer.keys = layer.keys.gather(2, g)
        layer.values = layer.values.gather(2, g)
    return new_valid


def select_rows(cache, valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Keep only batch rows `rows` (finished requests leave the batch); trims shared left padding."""
    for layer in cache.layers:
        layer.keys = layer.keys.index_select(0, rows)
        layer.values = layer.values.index_select(0, rows)
    valid = valid.index_select(0, rows)
    start = int((~valid).all(0).long().cumprod(0).sum())  # columns that are padding in every row
    if start:
        for layer in cache.layers:
            layer.keys, layer.values = layer.keys[:, :, start:], layer.values[:, :, start:]
        valid = valid[:, start:]
    return valid
