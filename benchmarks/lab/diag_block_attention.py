"""Where does DFlash's first predicting slot (slot 1) look? (issue 21, item 2)

Mean attention weight of the slot-1 query, per layer and head, on: slot 0 (the anchor token x_p),
context position p-1 (the newest target feature: what an EAGLE-3 head gets in its residual), the whole
context; and the spread (max - min) of its attention logits; over every anchor of the last 16
regenerated Alpaca rows. Needs a run of benchmarks/lab/diag_block_first_slot.py (its checkpoint and
runs/regen/regenerated.jsonl):

    python benchmarks/lab/diag_block_attention.py runs/diag/dflash-300
    DIAG_QK=identity python benchmarks/lab/diag_block_attention.py runs/diag/dflash-300-noqknorm
"""
from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks" / "lab"))

from diag_block_first_slot import patch_qk_norm  # noqa: E402

from draftsmith.checkpoint import load_drafter  # noqa: E402
from draftsmith.data import chat, features  # noqa: E402


def slot1_attention(d, batch, ids, acc: dict) -> None:
    """Accumulate slot-1 attention statistics of every block anchored at 8 .. s - B - 1."""
    s, B = ids.shape[1], d.block_size
    anchors = torch.arange(8, s - B)[None]  # [1, A]
    A, p = anchors.shape[1], anchors[0]
    ctx = d.context(batch["aux_hidden_states"])
    ctx_kv = d.context_kv(ctx, torch.arange(s)[None])
    block, pos = d.block_inputs(ids, anchors)
    mask = d.training_mask(anchors, batch["attention_mask"])  # [1, 1, A*B, s + A*B]
    x = d.embed_tokens[0](block)
    cos, sin = d.rotary(x, pos)
    qi = torch.arange(A) * B + 1  # the slot-1 query of each block
    for li, (layer, (ck, cv)) in enumerate(zip(d.layers, ctx_kv)):
        a = layer.self_attn
        xn = layer.input_layernorm(x)
        q = a.q_norm(a.q_proj(xn).view(1, xn.shape[1], a.num_heads, a.head_dim)).transpose(1, 2)
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k, _ = a.keys_values(xn, cos, sin)
        keys = torch.cat([ck, k], 2).repeat_interleave(a.num_heads // a.num_kv_heads, 1)
        scores = ((q @ keys.transpose(-1, -2)) / math.sqrt(a.head_dim))[0][:, qi]  # [H, A, s + A*B]
        allowed = mask[0, 0, qi][None]  # [1, A, s + A*B]
        w = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        spread = scores.masked_fill(~allowed, -1e9).amax(-1) - scores.masked_fill(~allowed, 1e9).amin(-1)
        stats = {"slot0": w[:, torch.arange(A), s + torch.arange(A) * B], "ctx_p-1": w[:, torch.arange(A), p - 1],
                 "ctx_all": w[:, :, :s].sum(-1), "logit_range": spread}
        for name, val in stats.items():
            acc.setdefault((li, name), []).append(val.mean(-1))  # [H]
        x = layer(x, cos, sin, ck, cv, mask)


def main() -> None:
    patch_qk_norm()
    loaded = load_drafter(Path(sys.argv[1]) / "final")
    d, t = loaded.drafter, loaded.target
    d.eval()
    rows = [json.loads(x) for x in open(REPO / "runs" / "regen" / "regenerated.jsonl")][-16:]
    acc: dict = {}
    for r in rows:
        ids = torch.tensor(chat.encode_prompt(t.tokenizer, r["messages"], "plain")[:192])[None]
        batch = features.complete(t, {"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                      "loss_mask": torch.ones_like(ids)}, set(d.required_features), d.feature_layers())
        with torch.no_grad():
            slot1_attention(d, batch, ids, acc)
    for (li, name), vals in sorted(acc.items()):
        m = torch.stack(vals).mean(0)
        print(f"layer {li} {name:12s} per head: " + " ".join(f"{float(v):.2f}" for v in m) + f" | max {float(m.max()):.2f}")


if __name__ == "__main__":
    main()
