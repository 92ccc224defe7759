"""The single Llama-style decoder layer EAGLE drafters run, with two attention paths:

- cached attention for inference (a small KV cache that the proposer crops on rejection), and
- training-time-test (TTT) attention (EAGLE-3, Li et al. 2025, sec. 3): at unroll step t the
  query at position j attends to the step-0 keys at positions <= j (the real prefix) and to the
  keys that steps 1..t produced at the same position j (its own draft chain). This is exactly
  what the cached path sees at inference, where chain entries are appended after the prefix.

RoPE, RMSNorm and the MLP come from transformers' own Llama modules, configured from the
target's config (rope_theta / rope_scaling carried over).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from draftsmith.data import packing
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb


def draft_layer_config(target_config, num_heads=None, num_kv_heads=None, intermediate_size=None):
    """A LlamaConfig for one draft layer with the target's width, rope and norm settings."""
    from transformers import LlamaConfig

    tc = target_config
    heads = num_heads or tc.num_attention_heads
    kv_heads = num_kv_heads or getattr(tc, "num_key_value_heads", None) or heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    rope = getattr(tc, "rope_parameters", None) or {"rope_type": "default", "rope_theta": getattr(tc, "rope_theta", 10000.0)}
    return LlamaConfig(
        hidden_size=tc.hidden_size,
        intermediate_size=intermediate_size or tc.intermediate_size,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        num_hidden_layers=1,
        vocab_size=tc.vocab_size,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-6),
        max_position_embeddings=tc.max_position_embeddings,
        rope_parameters=dict(rope),
        hidden_act=getattr(tc, "hidden_act", "silu"),
        attention_bias=False,
        mlp_bias=False,
    )


class KVCache:
    """Keys/values of the one draft layer for one request: [1, kv_heads, L, d]."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Keep the first `length` entries (the rollback after a rejection)."""
        if self.k is not None:
            self.k, self.v = self.k[:, :, :length], self.v[:, :, :length]


class DraftAttention(nn.Module):
    def __init__(self, config, input_size: int):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(input_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(input_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=False)

    def project(self, x, cos, sin):
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, self.num_heads, self.head_dim).transpose(1, 2)  # [b, n, in] -> [b, H, n, d]
        k = self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)  # -> [b, KV, n, d]
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def _expand(self, t: torch.Tensor) -> torch.Tensor:
        return t.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)  # [b, KV, L, d] -> [b, H, L, d]

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        b, _, n, _ = o.shape
        return self.o_proj(o.transpose(1, 2).reshape(b, n, -1))  # [b, H, n, d] -> [b, n, h]

    def forward_cached(self, x, cos, sin, cache: KVCache) -> torch.Tensor:
        """Inference: the n new positions attend to the whole cache and causally to each other."""
        q, k, v = self.project(x, cos, sin)
        keys, values = cache.append(k, v)
        n, total = q.shape[2], keys.shape[2]
        mask = torch.ones(n, total, dtype=torch.bool, device=x.device).tril(diagonal=total - n)
        o = torch.nn.functional.scaled_dot_product_attention(q, self._expand(keys), self._expand(values), attn_mask=mask)
        return self._out(o)

    def forward_ttt(self, x, cos, sin, step_kv: list[tuple[torch.Tensor, torch.Tensor]],
                    documents: torch.Tensor | None = None) -> torch.Tensor:
        """Training: unroll step t = len(step_kv) over n positions (EAGLE-3 TTT attention).

        step_kv holds (k, v) of the earlier steps; step 0's keys are the causal prefix,
        later steps contribute one key per position (the diagonal). This step's (k, v) is
        appended to step_kv. documents [b, >= n] (packed rows, data/packing.py): prefix keys
        of another document are masked; chain keys share the query's position, hence its document.
        """
        q, k, v = self.project(x, cos, sin)
        step_kv.append((k, v))
        n = q.shape[2]
        scale = 1.0 / math.sqrt(self.head_dim)
        # 1. causal scores against the step-0 keys (the real prefix)
        k0, v0 = (self._expand(t[:, :, :n]) for t in step_kv[0])
        prefix = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [b, H, n, n]
        if documents is None:
            causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        else:
            causal = packing.same_document_causal(documents, n)  # [b, 1, n, n]
        prefix = prefix.masked_fill(~causal, float("-inf"))
        # 2. one score per earlier chain step s = 1..t at the same position (the diagonal)
        chain_v = [self._expand(sv[:, :, :n]) for _, sv in step_kv[1:]]
        chain = [(q * self._expand(sk[:, :, :n])).sum(-1, keepdim=True) * scale for sk, _ in step_kv[1:]]  # [b, H, n, 1]
        # 3. one softmax over prefix + chain, then the weighted values
        weights = torch.softmax(torch.cat([prefix, *chain], dim=-1).float(), dim=-1).to(q.dtype)  # [b, H, n, n + t]
        o = torch.matmul(weights[..., :n], v0)
        for s, values in enumerate(chain_v):
            o = o + weights[..., n + s : n + s + 1] * values
        return self._out(o)


class DraftDecoderLayer(nn.Module):
    """One Llama decoder layer whose attention reads `input_size` features.

    EAGLE-3 feeds [norm(embedding) ; norm(hidden)] (2h) with the hidden as residual; EAGLE-1
    feeds fc([embedding ; feature]) (h). `forward` takes the already-built attention input.
    """

    def __init__(self, config, input_size: int):
        super().__init__()
        self.self_attn = DraftAttention(config, input_size)
        self.mlp = LlamaMLP(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, attn_input, residual, cos, sin, cache: KVCache | None = None, step_kv=None, documents=None):
        if cache is not None:
            attn = self.self_attn.forward_cached(attn_input, cos, sin, cache)
        else:
            attn = self.self_attn.forward_ttt(attn_input, cos, sin, step_kv, documents)
        hidden = residual + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden))


def rotary(config) -> LlamaRotaryEmbedding:
    return LlamaRotaryEmbedding(config)
