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
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

from draftsmith import packing


def draft_layer_config(target_config, num_heads=None, num_kv_heads=None, intermediate_size=None):
    """A LlamaConfig for one draft layer with the target's width, rope and norm settings."""
    from transformers import LlamaConfig

    from draftsmith.archs import draft_rope

    tc = target_config
    heads = num_heads or tc.num_attention_heads
    kv_heads = num_kv_heads or getattr(tc, "num_key_value_heads", None) or heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    rope = draft_rope(tc)  # the target's rope schedule (full-attention layers'), whole-head rotary
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
        # Tree drafting (eval/tree.py) sets the next forward's attention [n, total] (True = attend)
        # in place of the causal one; it is used once.
        self.next_mask: torch.Tensor | None = None

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
        self.ttt_impl = "auto"  # TTT attention kernel (see ttt_attention); train.ttt_attention sets it
        self.ttt_chunk = 256  # query block of the chunked kernel

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
        if cache.next_mask is not None:
            mask, cache.next_mask = cache.next_mask.to(x.device), None  # [n, total] tree mask
        o = torch.nn.functional.scaled_dot_product_attention(q, self._expand(keys), self._expand(values), attn_mask=mask)
        return self._out(o)

    def forward_ttt(self, x, cos, sin, step_kv: list[tuple[torch.Tensor, torch.Tensor]],
                    documents: torch.Tensor | None = None) -> torch.Tensor:
        """Training: unroll step t = len(step_kv) over n positions (EAGLE-3 TTT attention).

        step_kv holds (k, v) of the earlier steps; step 0's keys are the causal prefix,
        later steps contribute one key per position (the diagonal). This step's (k, v) is
        appended to step_kv. documents [b, >= n] (packed rows, packing.py): prefix keys
        of another document are masked; chain keys share the query's position, hence its document.
        """
        out, k, v = self.ttt(x, cos, sin, step_kv, documents)
        step_kv.append((k, v))
        return out

    def ttt(self, x, cos, sin, prior: list, documents=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pure form of forward_ttt (no list mutation, so it can be recomputed under
        checkpointing): -> (attention output [b, n, h], this step's k, v [b, KV, n, d])."""
        q, k, v = self.project(x, cos, sin)
        o = ttt_attention(q, [*prior, (k, v)], documents, 1.0 / math.sqrt(self.head_dim), self.ttt_impl, self.ttt_chunk)
        return self._out(o), k, v


# ---------------------------------------------------------------------- TTT attention kernels
TTT_IMPLS = ("auto", "eager", "chunked", "flex")


def ttt_attention(q, kv: list, documents, scale: float, impl: str = "auto", chunk: int = 256) -> torch.Tensor:
    """EAGLE-3 TTT attention (Li et al. 2025, sec. 3) of step t = len(kv) - 1.

    q [b, H, n, d]; kv[s] = (k, v) [b, KV, >= n, d] of steps 0..t (the last is this step's);
    documents [b, >= n] or None. Query j sees step-0 keys i <= j of its document and the keys
    of steps 1..t at position j. -> o [b, H, n, d].

    impl: "eager" (today's reference: the full [b, H, n, n + t] fp32 scores, kept for backward),
    "chunked" (query blocks of `chunk`, each recomputed in backward: peak O(chunk * n) scores),
    "flex" (flex_attention with a block mask over [k_0; ...; k_t]; fused when compiled, on GPU),
    "auto" (flex on CUDA, chunked elsewhere). All equal in fp32 (tests/unit/test_ttt_attention.py).
    """
    if impl == "auto":
        impl = "flex" if q.is_cuda else "chunked"
    if impl == "eager":
        return _ttt_eager(q, kv, documents, scale)
    if impl == "chunked":
        return _ttt_chunked(q, kv, documents, scale, chunk)
    if impl == "flex":
        return _ttt_flex(q, kv, documents, scale)
    raise ValueError(f"TTT attention {impl!r} is not one of {TTT_IMPLS}")


def _expand(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)  # [b, KV, L, d] -> [b, H, L, d]


def _ttt_eager(q, kv, documents, scale):
    """Today's implementation: one softmax over [b, H, n, n + t] fp32 scores."""
    n, heads = q.shape[2], q.shape[1]
    # 1. causal scores against the step-0 keys (the real prefix)
    k0, v0 = (_expand(t[:, :, :n], heads) for t in kv[0])
    prefix = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [b, H, n, n]
    if documents is None:
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    else:
        causal = packing.same_document_causal(documents, n)  # [b, 1, n, n]
    prefix = prefix.masked_fill(~causal, float("-inf"))
    # 2. one score per earlier chain step s = 1..t at the same position (the diagonal)
    chain_v = [_expand(sv[:, :, :n], heads) for _, sv in kv[1:]]
    chain = [(q * _expand(sk[:, :, :n], heads)).sum(-1, keepdim=True) * scale for sk, _ in kv[1:]]  # [b, H, n, 1]
    # 3. one softmax over prefix + chain, then the weighted values
    weights = torch.softmax(torch.cat([prefix, *chain], dim=-1).float(), dim=-1).to(q.dtype)  # [b, H, n, n + t]
    o = torch.matmul(weights[..., :n], v0)
    for s, values in enumerate(chain_v):
        o = o + weights[..., n + s : n + s + 1] * values
    return o


def _ttt_block(start: int, scale: float, q, k0, v0, doc_q, doc_k, *chain):
    """Queries [start, start + B) against step-0 keys [0, e) (e = start + B: causality ends there)
    and their own chain keys; grouped heads without expanding k/v. -> [b, H, B, d]."""
    b, heads, B, d = q.shape
    kvh, e = k0.shape[1], k0.shape[2]
    qg = q.reshape(b, kvh, heads // kvh, B, d)  # [b, H, B, d] -> [b, KV, G, B, d]
    scores = torch.matmul(qg, k0[:, :, None].transpose(-1, -2)) * scale  # [b, KV, G, B, e]
    allowed = torch.ones(B, e, dtype=torch.bool, device=q.device).tril(diagonal=start)  # key i <= query start + r
    if doc_q is not None:
        allowed = allowed & (doc_q[:, :, None] == doc_k[:, None, :])[:, None, None]  # [b, 1, 1, B, e]
    scores = scores.masked_fill(~allowed, float("-inf"))
    t = len(chain) // 2
    chain_scores = [(qg * ck[:, :, None]).sum(-1, keepdim=True) * scale for ck in chain[:t]]  # [b, KV, G, B, 1]
    weights = torch.softmax(torch.cat([scores, *chain_scores], dim=-1).float(), dim=-1).to(q.dtype)  # [.., B, e + t]
    o = torch.matmul(weights[..., :e], v0[:, :, None])  # [b, KV, G, B, d]
    for s, cv in enumerate(chain[t:]):
        o = o + weights[..., e + s : e + s + 1] * cv[:, :, None]
    return o.reshape(b, heads, B, d)


def _ttt_chunked(q, kv, documents, scale, chunk):
    """Query blocks; with gradients each block runs under activation checkpointing, so backward
    keeps only its inputs (views of q, k, v) and recomputes one block's scores at a time."""
    from torch.utils.checkpoint import checkpoint

    n = q.shape[2]
    k0, v0 = kv[0][0][:, :, :n], kv[0][1][:, :, :n]
    chain = [k[:, :, :n] for k, _ in kv[1:]] + [v[:, :, :n] for _, v in kv[1:]]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k0, v0, *chain))
    outs = []
    for a in range(0, n, chunk):
        e = min(n, a + chunk)
        doc_q = None if documents is None else documents[:, a:e]
        doc_k = None if documents is None else documents[:, :e]
        args = (a, scale, q[:, :, a:e], k0[:, :, :e], v0[:, :, :e], doc_q, doc_k, *[c[:, :, a:e] for c in chain])
        outs.append(checkpoint(_ttt_block, *args, use_reentrant=False) if grad else _ttt_block(*args))
    return torch.cat(outs, dim=2)  # n/chunk x [b, H, B, d] -> [b, H, n, d]


_FLEX = {}


def _ttt_flex(q, kv, documents, scale):
    """flex_attention over the keys of all steps [k_0; k_1; ...; k_t] (length (t + 1) n) with a
    block mask: step-0 keys causal (and same document), step s >= 1 keys only at the query's own
    position. Compiled on CUDA (fused, no score tensor); eager elsewhere (for parity tests)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, _, n, _ = q.shape
    if not q.is_cuda and torch.is_grad_enabled() and q.requires_grad:
        raise ValueError("TTT attention 'flex' has no CPU backward in torch; train on CPU with "
                         "train.ttt_attention=chunked (or auto)")
    keys = torch.cat([k[:, :, :n] for k, _ in kv], dim=2)  # (t+1) x [b, KV, n, d] -> [b, KV, (t+1) n, d]
    values = torch.cat([v[:, :, :n] for _, v in kv], dim=2)
    docs = None if documents is None else documents[:, :n].contiguous()

    def mask_mod(bi, h, qi, ki):
        step, i = ki // n, ki % n
        prefix = (step == 0) & (i <= qi)
        if docs is not None:
            prefix = prefix & (docs[bi, qi] == docs[bi, i])
        return prefix | ((step > 0) & (i == qi))

    block = create_block_mask(mask_mod, B=b if docs is not None else None, H=None, Q_LEN=n, KV_LEN=keys.shape[2],
                              device=q.device)
    if not q.is_cuda:  # (no grad here) flex's CPU check refuses inputs that require grad even under no_grad
        q, keys, values = q.detach(), keys.detach(), values.detach()
    if q.is_cuda:
        if "compiled" not in _FLEX:
            _FLEX["compiled"] = torch.compile(flex_attention, dynamic=False)
        fn = _FLEX["compiled"]
    else:
        fn = flex_attention
    return fn(q, keys, values, block_mask=block, scale=scale, enable_gqa=q.shape[1] != keys.shape[1])


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
        self.gradient_checkpointing = False  # train.gradient_checkpointing: recompute TTT steps in backward

    def forward(self, attn_input, residual, cos, sin, cache: KVCache | None = None, step_kv=None, documents=None):
        if cache is not None:
            hidden = residual + self.self_attn.forward_cached(attn_input, cos, sin, cache)
            return hidden + self.mlp(self.post_attention_layernorm(hidden))
        flat = [t for kv in step_kv for t in kv]
        if self.gradient_checkpointing and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            # keeps only the layer's inputs per TTT step; its activations are recomputed in backward
            out, k, v = checkpoint(self._ttt_step, attn_input, residual, cos, sin, documents, *flat, use_reentrant=False)
        else:
            out, k, v = self._ttt_step(attn_input, residual, cos, sin, documents, *flat)
        step_kv.append((k, v))
        return out

    def _ttt_step(self, attn_input, residual, cos, sin, documents, *flat):
        """One TTT step of the whole layer, pure (the earlier steps' k, v come flattened)."""
        prior = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        attn, k, v = self.self_attn.ttt(attn_input, cos, sin, prior, documents)
        hidden = residual + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), k, v


def rotary(config) -> LlamaRotaryEmbedding:
    return LlamaRotaryEmbedding(config)


def configure(module: nn.Module, ttt_attention: str = "auto", gradient_checkpointing: bool = False) -> int:
    """Set the TTT kernel and checkpointing of every draft layer inside `module` (recipe switches
    train.ttt_attention / train.gradient_checkpointing; kinds without a draft layer are untouched).
    Returns the number of draft layers configured."""
    if ttt_attention not in TTT_IMPLS:
        raise ValueError(f"train.ttt_attention {ttt_attention!r} is not one of {TTT_IMPLS}")
    count = 0
    for m in module.modules():
        if isinstance(m, DraftDecoderLayer):
            m.gradient_checkpointing = gradient_checkpointing
            m.self_attn.ttt_impl = ttt_attention
            count += 1
    return count
