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

from draftsmith.core.errors import UserError
from draftsmith.data import packing


def draft_layer_config(target_config, num_heads=None, num_kv_heads=None, intermediate_size=None, head_dim=None,
                       sliding_window=None):
    """A LlamaConfig for one draft layer with the target's width, rope and norm settings. Heads, kv heads,
    head_dim and intermediate size default to the target's (head_dim may differ from hidden / heads: the
    q/k/v projections map to heads * head_dim and o_proj back to the hidden size); sliding_window: each
    query sees keys at most sliding_window - 1 positions back (None: full attention)."""
    from transformers import LlamaConfig

    from draftsmith.targets.archs import draft_rope, text_config

    tc = text_config(target_config)  # a vision-language target: its text backbone
    heads = num_heads or tc.num_attention_heads
    kv_heads = num_kv_heads or getattr(tc, "num_key_value_heads", None) or heads
    head_dim = head_dim or getattr(tc, "head_dim", None) or tc.hidden_size // tc.num_attention_heads
    if tc.hidden_size % heads:  # transformers' LlamaConfig (and every engine config reader built on it) refuses it
        raise UserError(f"drafter.num_heads {heads}: the target's hidden size {tc.hidden_size} must be a multiple of the "
                         "draft layer's head count (transformers' LlamaConfig checks it, so no engine could load the "
                         "export); widen the heads with drafter.head_dim instead")
    rope = draft_rope(tc)  # the target's rope schedule (full-attention layers'), whole-head rotary
    return _with_window(LlamaConfig(
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
    ), sliding_window)


def _with_window(config, sliding_window):
    """The draft layer's attention window rides on its config (DraftAttention reads it); LlamaConfig has no
    such field, so it is set as a plain attribute (None: full attention)."""
    config.draft_sliding_window = sliding_window
    return config


MAX_HEADS = 1024  # attention heads of one draft layer (the largest targets have 128)
MAX_HEAD_DIM = 4096
MAX_INTERMEDIATE = 1 << 20


def layer_shape_problems(cfg) -> list[str]:
    """The draft layer's shape options that cannot build a layer (a drafter Config with num_heads,
    num_kv_heads and head_dim; None copies the target's)."""
    out = []
    for key, bound in (("num_heads", MAX_HEADS), ("num_kv_heads", MAX_HEADS), ("head_dim", MAX_HEAD_DIM),
                       ("intermediate_size", MAX_INTERMEDIATE)):
        value = getattr(cfg, key, None)
        if isinstance(value, int) and value > bound:  # 10^12 KV heads was an allocation traceback
            out.append(f"drafter.{key}: must be <= {bound:,} (one draft layer), got {value:,}")
    if out:
        return out
    head_dim = getattr(cfg, "head_dim", None)
    if head_dim is not None and head_dim % 2:
        out.append(f"drafter.head_dim: must be even (rope rotates pairs of dimensions), got {head_dim}")
    if cfg.num_heads and cfg.num_kv_heads and cfg.num_heads % cfg.num_kv_heads:
        out.append(f"drafter.num_heads {cfg.num_heads} must be a multiple of drafter.num_kv_heads {cfg.num_kv_heads} "
                   "(grouped-query attention)")
    return out


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor | None:
    """[n] query positions, [L] key positions -> [n, L] bool: key within the window (q - k < window);
    None without a window. Causality is the caller's mask."""
    if window is None:
        return None
    return (q_pos[:, None] - k_pos[None, :]) < window


class KVCache:
    """Keys/values of the one draft layer for one request: [1, kv_heads, L, d]."""

    def __init__(self):
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.pos: torch.Tensor | None = None  # [L] the position of each entry (a sliding window reads them)
        # Tree drafting (eval/tree.py) sets the next forward's attention [n, total] (True = attend)
        # in place of the causal one; it is used once.
        self.next_mask: torch.Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    def append(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v [1, KV, n, d]; pos [n] their positions (None: the next n entry indices)."""
        if pos is None:
            pos = torch.arange(len(self), len(self) + k.shape[2], device=k.device)
        self.pos = pos if self.pos is None else torch.cat([self.pos, pos.to(self.pos.device)])
        self.k = k if self.k is None else torch.cat([self.k, k], dim=2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=2)
        return self.k, self.v

    def crop(self, length: int) -> None:
        """Keep the first `length` entries (the rollback after a rejection)."""
        if self.k is not None:
            self.k, self.v, self.pos = self.k[:, :, :length], self.v[:, :, :length], self.pos[:length]


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
        self.window = getattr(config, "draft_sliding_window", None)  # drafter.sliding_window; None: full attention
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

    def forward_cached(self, x, cos, sin, cache: KVCache, positions: torch.Tensor | None = None) -> torch.Tensor:
        """Inference: the n new positions attend to the whole cache and causally to each other (with a
        sliding window: only to keys less than `window` positions back). positions [1, n] (None: entry indices)."""
        q, k, v = self.project(x, cos, sin)
        keys, values = cache.append(k, v, None if positions is None else positions[0])
        n, total = q.shape[2], keys.shape[2]
        mask = torch.ones(n, total, dtype=torch.bool, device=x.device).tril(diagonal=total - n)
        if cache.next_mask is not None:
            mask, cache.next_mask = cache.next_mask.to(x.device), None  # [n, total] tree mask
        if self.window is not None:
            mask = mask & window_mask(cache.pos[total - n:], cache.pos, self.window)  # [n, total]
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

    def ttt(self, x, cos, sin, prior: list, documents=None, anchors=None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The pure form of forward_ttt (no list mutation, so it can be recomputed under
        checkpointing): -> (attention output [b, n, h], this step's k, v [b, KV, n, d]).
        anchors [m] (sorted indices): x holds only those m positions of this step (ttt_attention)."""
        q, k, v = self.project(x, cos, sin)
        o = ttt_attention(q, [*prior, (k, v)], documents, 1.0 / math.sqrt(self.head_dim), self.ttt_impl, self.ttt_chunk,
                          self.window, anchors)
        return self._out(o), k, v


# ---------------------------------------------------------------------- TTT attention kernels
TTT_IMPLS = ("auto", "eager", "chunked", "flex")


def ttt_attention(q, kv: list, documents, scale: float, impl: str = "auto", chunk: int = 256,
                  window: int | None = None, anchors: torch.Tensor | None = None) -> torch.Tensor:
    """EAGLE-3 TTT attention (Li et al. 2025, sec. 3) of step t = len(kv) - 1.

    q [b, H, n, d]; kv[s] = (k, v) [b, KV, >= n, d] of steps 0..t (the last is this step's);
    documents [b, >= n] or None. Query j sees step-0 keys i <= j of its document and the keys
    of steps 1..t at position j. -> o [b, H, n, d].

    window (drafter.sliding_window; None: full): query j of step t sits at position j + t, step-0 key i at
    position i and step s's key at position j + s (as in the loop's KV cache), so it keeps the keys less than
    `window` positions back: step-0 keys with j - i < window - t, chain keys of steps s > t - window.

    impl: "eager" (today's reference: the full [b, H, n, n + t] fp32 scores, kept for backward),
    "chunked" (query blocks of `chunk`, each recomputed in backward: peak O(chunk * n) scores),
    "flex" (flex_attention with a block mask over [k_0; ...; k_t]; fused when compiled, on GPU),
    "auto" (flex on CUDA, chunked elsewhere). All equal in fp32 (tests/heads/test_ttt_attention.py).

    anchors [m] (sorted indices j; drafter.ttt_anchor_fraction): this step's queries, and the chain keys
    of steps 1..t, are those m positions only (q [b, H, m, d]); step-0 keys stay whole. One [b, H, m, n]
    score block (_ttt_anchors), whatever impl says.
    """
    prefix_window = None
    if window is not None:
        t = len(kv) - 1
        kv = [kv[0], *(kv[s] for s in range(1, t + 1) if t - s < window)]
        prefix_window = window - t  # step-0 keys i with j - i < prefix_window (none when <= 0)
    if anchors is not None:
        return _ttt_anchors(q, kv, documents, scale, anchors, prefix_window)
    if impl == "auto":
        impl = "flex" if q.is_cuda else "chunked"
    if impl == "eager":
        return _ttt_eager(q, kv, documents, scale, prefix_window)
    if impl == "chunked":
        return _ttt_chunked(q, kv, documents, scale, chunk, prefix_window)
    if impl == "flex":
        return _ttt_flex(q, kv, documents, scale, prefix_window)
    raise UserError(f"TTT attention {impl!r} is not one of {TTT_IMPLS}")


def _expand(t: torch.Tensor, heads: int) -> torch.Tensor:
    return t.repeat_interleave(heads // t.shape[1], dim=1)  # [b, KV, L, d] -> [b, H, L, d]


def _ttt_eager(q, kv, documents, scale, prefix_window=None):
    """Today's implementation: one softmax over [b, H, n, n + t] fp32 scores."""
    n, heads = q.shape[2], q.shape[1]
    # 1. causal scores against the step-0 keys (the real prefix)
    k0, v0 = (_expand(t[:, :, :n], heads) for t in kv[0])
    prefix = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [b, H, n, n]
    if documents is None:
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
    else:
        causal = packing.same_document_causal(documents, n)  # [b, 1, n, n]
    if prefix_window is not None:  # key i only when j - i < prefix_window
        causal = causal & torch.ones(n, n, dtype=torch.bool, device=q.device).triu(diagonal=1 - prefix_window)
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


def _ttt_anchors(q, kv, documents, scale, anchors, prefix_window=None):
    """_ttt_eager for queries at the m sorted positions `anchors`: query r (position anchors[r]) sees step-0
    keys i <= anchors[r] of its document and entry r of each earlier chain step."""
    m, heads = q.shape[2], q.shape[1]
    n = int(anchors[-1]) + 1 if m else 1
    k0, v0 = (_expand(t[:, :, :n], heads) for t in kv[0])  # [b, H, n, d]
    prefix = torch.matmul(q, k0.transpose(-1, -2)) * scale  # [b, H, m, n]
    keys = torch.arange(n, device=q.device)
    allowed = keys[None, :] <= anchors[:, None]  # [m, n]
    if prefix_window is not None:
        allowed = allowed & (anchors[:, None] - keys[None, :] < prefix_window)
    if documents is not None:
        allowed = allowed & (documents[:, anchors][:, :, None] == documents[:, None, :n])[:, None]  # [b, 1, m, n]
    prefix = prefix.masked_fill(~allowed, float("-inf"))
    chain_v = [_expand(sv[:, :, :m], heads) for _, sv in kv[1:]]
    chain = [(q * _expand(sk[:, :, :m], heads)).sum(-1, keepdim=True) * scale for sk, _ in kv[1:]]  # [b, H, m, 1]
    weights = torch.softmax(torch.cat([prefix, *chain], dim=-1).float(), dim=-1).to(q.dtype)  # [b, H, m, n + t]
    o = torch.matmul(weights[..., :n], v0)
    for s, values in enumerate(chain_v):
        o = o + weights[..., n + s : n + s + 1] * values
    return o


def _ttt_block(start: int, scale: float, prefix_window, q, k0, v0, doc_q, doc_k, *chain):
    """Queries [start, start + B) against step-0 keys [0, e) (e = start + B: causality ends there)
    and their own chain keys; grouped heads without expanding k/v. -> [b, H, B, d]."""
    b, heads, B, d = q.shape
    kvh, e = k0.shape[1], k0.shape[2]
    qg = q.reshape(b, kvh, heads // kvh, B, d)  # [b, H, B, d] -> [b, KV, G, B, d]
    scores = torch.matmul(qg, k0[:, :, None].transpose(-1, -2)) * scale  # [b, KV, G, B, e]
    allowed = torch.ones(B, e, dtype=torch.bool, device=q.device).tril(diagonal=start)  # key i <= query start + r
    if prefix_window is not None:  # and start + r - i < prefix_window
        allowed = allowed & torch.ones(B, e, dtype=torch.bool, device=q.device).triu(diagonal=start + 1 - prefix_window)
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


def _ttt_chunked(q, kv, documents, scale, chunk, prefix_window=None):
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
        args = (a, scale, prefix_window, q[:, :, a:e], k0[:, :, :e], v0[:, :, :e], doc_q, doc_k, *[c[:, :, a:e] for c in chain])
        outs.append(checkpoint(_ttt_block, *args, use_reentrant=False) if grad else _ttt_block(*args))
    return torch.cat(outs, dim=2)  # n/chunk x [b, H, B, d] -> [b, H, n, d]


_FLEX = {}


def _ttt_flex(q, kv, documents, scale, prefix_window=None):
    """flex_attention over the keys of all steps [k_0; k_1; ...; k_t] (length (t + 1) n) with a
    block mask: step-0 keys causal (and same document), step s >= 1 keys only at the query's own
    position. Compiled on CUDA (fused, no score tensor); eager elsewhere (for parity tests)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    b, _, n, _ = q.shape
    if not q.is_cuda and torch.is_grad_enabled() and q.requires_grad:
        raise UserError("TTT attention 'flex' has no CPU backward in torch; train on CPU with "
                         "train.ttt_attention=chunked (or auto)")
    keys = torch.cat([k[:, :, :n] for k, _ in kv], dim=2)  # (t+1) x [b, KV, n, d] -> [b, KV, (t+1) n, d]
    values = torch.cat([v[:, :, :n] for _, v in kv], dim=2)
    docs = None if documents is None else documents[:, :n].contiguous()

    def mask_mod(bi, h, qi, ki):
        step, i = ki // n, ki % n
        prefix = (step == 0) & (i <= qi)
        if prefix_window is not None:
            prefix = prefix & (qi - i < prefix_window)
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

    def forward(self, attn_input, residual, cos, sin, cache: KVCache | None = None, step_kv=None, documents=None,
                positions: torch.Tensor | None = None, anchors: torch.Tensor | None = None):
        """positions [1, n] of the new entries (cached path; a sliding window reads them). anchors [m]: a TTT
        step at those positions only (ttt_attention)."""
        if cache is not None:
            hidden = residual + self.self_attn.forward_cached(attn_input, cos, sin, cache, positions)
            return hidden + self.mlp(self.post_attention_layernorm(hidden))
        flat = [t for kv in step_kv for t in kv]
        if self.gradient_checkpointing and torch.is_grad_enabled():
            from torch.utils.checkpoint import checkpoint

            # keeps only the layer's inputs per TTT step; its activations are recomputed in backward
            out, k, v = checkpoint(self._ttt_step, attn_input, residual, cos, sin, documents, anchors, *flat,
                                   use_reentrant=False)
        else:
            out, k, v = self._ttt_step(attn_input, residual, cos, sin, documents, anchors, *flat)
        step_kv.append((k, v))
        return out

    def _ttt_step(self, attn_input, residual, cos, sin, documents, anchors, *flat):
        """One TTT step of the whole layer, pure (the earlier steps' k, v come flattened)."""
        prior = [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)]
        attn, k, v = self.self_attn.ttt(attn_input, cos, sin, prior, documents, anchors)
        hidden = residual + attn
        return hidden + self.mlp(self.post_attention_layernorm(hidden)), k, v


def rotary(config) -> LlamaRotaryEmbedding:
    return LlamaRotaryEmbedding(config)


def configure(module: nn.Module, ttt_attention: str = "auto", gradient_checkpointing: bool = False) -> int:
    """Set the TTT kernel and checkpointing of every draft layer inside `module` (recipe switches
    train.ttt_attention / train.gradient_checkpointing; kinds without a draft layer are untouched).
    Returns the number of draft layers configured."""
    if ttt_attention not in TTT_IMPLS:
        raise UserError(f"train.ttt_attention {ttt_attention!r} is not one of {TTT_IMPLS}")
    count = 0
    for m in module.modules():
        if isinstance(m, DraftDecoderLayer):
            m.gradient_checkpointing = gradient_checkpointing
            m.self_attn.ttt_impl = ttt_attention
            count += 1
    return count
