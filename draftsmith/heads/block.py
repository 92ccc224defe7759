"""The block-drafter family: DFlash (heads/dflash.py), DSpark (heads/dspark.py) and DFlash 2 (heads/dflash2.py)
share this backbone, its training blocks and its proposer (P-EAGLE, heads/peagle.py, borrows the mask-token rule).

Architecture (tensor names follow speculators.models.dflash, so the vLLM export is a copy):
  fc, hidden_norm   [n*h -> h] then RMSNorm: the target's hidden states at the aux layers, fused
                    into one "context feature" per committed position
  layers.{i}        num_layers Qwen3-style decoder layers (q_norm/k_norm on heads). Their attention
                    reads the context feature as extra keys/values: k = [k_proj(ctx) ; k_proj(x)],
                    v = [v_proj(ctx) ; v_proj(x)] ("KV injection": every draft layer sees the
                    target's features, not just the first)
  norm, lm_head     final RMSNorm and the projection onto the draft vocabulary; lm_head starts as
                    the target's rows and is frozen unless train_lm_head (the paper shares the
                    target's head and embedding, both frozen)
  embed_tokens      the target's frozen embedding (shared, never trained, not in checkpoints)

One block (training and inference alike), anchor at position p:
  input    [x_p, MASK, ..., MASK] (block_size tokens) at positions p .. p+B-1
  context  the fused target features at positions < p (the anchor's own feature is not yet known
           at inference: x_p is the token the last verification just committed)
  attention  block queries see every context key and every block key (bidirectional in the block)
  output   slot i predicts x_{p+i} (DFlash: slot 0 is the anchor) or x_{p+i+1} (sample_from_anchor: DSpark).

Training samples many anchors per sequence (the paper's "random anchors" that make one target
forward train many blocks) and weights slot i's loss by a per-position decay (early slots decide the
acceptance length) or by D-PACE (heads/dpace.py).

BlockDrafting (a mixin next to Drafter) holds what the kinds share; BlockConfig their common options;
BlockProposer is the eval proposer of all of them: ONE forward per round, then the kind's draft_block().
"""

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm, apply_rotary_pos_emb

from draftsmith.core.bounds import MAX_DRAFT_TOKENS  # k per round: no engine verifies more
from draftsmith.core.errors import UserError
from draftsmith.core.sampling import logits_to_probs
from draftsmith.data import packing
from draftsmith.heads import dpace, vocab_loss
from draftsmith.heads.base import Draft, range_problems
from draftsmith.heads.draft_layer import draft_layer_config, rotary
from draftsmith.heads.shared import (
    Frozen,
    aux_layer_problems,
    draft_ids_of,
    draft_vocabulary,
    on_target_vocab,
    resolve_aux_layer_ids,
)


# --------------------------------------------------------------------------- the block layer
class BlockAttention(nn.Module):
    """Qwen3-style attention whose keys/values are [context features ; block] (DFlash KV injection)."""

    def __init__(self, config):
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.num_heads, self.num_kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.num_heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.v_proj = nn.Linear(h, self.num_kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.num_heads * d, h, bias=False)
        self.q_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)
        self.k_norm = LlamaRMSNorm(d, eps=config.rms_norm_eps)

    def keys_values(self, x, cos, sin):
        """[b, n, h] -> k, v [b, KV, n, d] (k normed and rotated at its positions)."""
        b, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim)).transpose(1, 2)  # [b, KV, n, d]
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        k, _ = apply_rotary_pos_emb(k, k, cos, sin)
        return k, v

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        """x [b, n, h] (normed block), ctx_k/ctx_v [b, KV, c, d], mask [b, 1, n, c + n] or None -> [b, n, h]."""
        b, n, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, n, self.num_heads, self.head_dim)).transpose(1, 2)  # [b, H, n, d]
        q, _ = apply_rotary_pos_emb(q, q, cos, sin)
        k, v = self.keys_values(x, cos, sin)
        rep = self.num_heads // self.num_kv_heads
        keys = torch.cat([ctx_k, k], dim=2).repeat_interleave(rep, dim=1)  # [b, H, c + n, d]
        values = torch.cat([ctx_v, v], dim=2).repeat_interleave(rep, dim=1)
        o = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask,
                                                             scale=1.0 / math.sqrt(self.head_dim))
        return self.o_proj(o.transpose(1, 2).reshape(b, n, -1))  # [b, H, n, d] -> [b, n, h]


class BlockLayer(nn.Module):
    """Pre-norm decoder layer; the context feature enters only through the attention's keys/values."""

    def __init__(self, config):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = BlockAttention(config)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


def sample_anchors(valid: torch.Tensor, num_anchors: int, generator: torch.Generator | None = None):
    """valid [b, s] bool (positions that may anchor a block) -> anchors [b, A], anchor_ok [b, A]:
    up to num_anchors distinct positions per row, drawn uniformly without replacement, sorted."""
    b, s = valid.shape
    scores = torch.rand(b, s, generator=generator).to(valid.device).masked_fill(~valid, 2.0)  # invalid sort last
    A = max(1, min(num_anchors, int(valid.sum(1).max())))
    picked = scores.topk(A, dim=1, largest=False)  # [b, A]
    anchors = picked.indices.sort(dim=1).values
    ok = valid.gather(1, anchors)  # [b, A]
    return anchors, ok


# --------------------------------------------------------------------------- shared by block drafters
class BlockDrafting:
    """What DFlash and DSpark share (a mixin next to Drafter, so each kind keeps one level of base
    classes): the backbone's layers, the context features, the block forward and the training blocks.

    `sample_from_anchor` (speculators' name): False (DFlash) - slot 0 is the anchor, slot i predicts
    x_{p+i}; True (DSpark) - slot i predicts x_{p+i+1}, so a block drafts block_size tokens.
    """

    sample_from_anchor: bool = False

    @classmethod
    def attention_window(cls, cfg) -> int | None:
        return cfg.sliding_window

    @classmethod
    def tokens_per_round(cls, cfg) -> int:
        """Tokens one block drafts: block_size - 1 (slot 0 is the anchor), or block_size with sample_from_anchor."""
        return cfg.block_size - (0 if cls.sample_from_anchor else 1)

    def build_modules(self, cfg, layer_config, aux_layer_ids: list[int], draft_vocab_size: int, target_vocab_size: int,
                      embed_tokens: nn.Embedding, mask_token_id: int) -> None:
        """The layers of every block drafter (called from the kind's __init__; no file I/O)."""
        h = layer_config.hidden_size
        self.cfg = cfg
        self.layer_config = layer_config
        self.aux_layer_ids = list(aux_layer_ids)
        self.block_size = cfg.block_size
        self.mask_token_id = mask_token_id
        self.fc = nn.Linear(len(aux_layer_ids) * h, h, bias=False)
        self.hidden_norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.layers = nn.ModuleList([self.make_layer(layer_config) for _ in range(cfg.num_layers)])
        self.norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.lm_head.weight.requires_grad_(cfg.train_lm_head)
        self.rotary = rotary(layer_config)
        self.embed_tokens = Frozen(embed_tokens)  # the target's: not a parameter, not in state_dict
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(target_vocab_size, dtype=torch.bool))
        if cfg.init_std is not None:  # the backbone's linear weights ~ Normal(0, init_std), as HF's post_init does
            for module in (self.fc, *self.layers):
                for linear in [m for m in module.modules() if isinstance(m, nn.Linear)]:
                    nn.init.normal_(linear.weight, std=cfg.init_std)

    def make_layer(self, layer_config) -> nn.Module:
        """One draft decoder layer (DFlash 2 wraps its sublayers in dynamic convolutions: heads/dflash2.py)."""
        return BlockLayer(layer_config)

    # ------------------------------------------------------------------ construction
    @classmethod
    def check_options(cls, cfg, target) -> None:
        if cfg.block_size < 2:
            raise UserError(f"drafter.block_size {cfg.block_size}: needs >= 2 (slot 0 is the anchor)")
        if cfg.num_layers < 1:
            raise UserError(f"drafter.num_layers {cfg.num_layers}: needs >= 1")
        if cfg.num_anchors < 1:
            raise UserError(f"drafter.num_anchors {cfg.num_anchors}: needs >= 1")

    @classmethod
    def resolve_mask_token(cls, cfg, target) -> int:
        mask = cfg.mask_token_id
        if mask is None:
            tok = target.tokenizer
            mask = next((t for t in (getattr(tok, "pad_token_id", None), getattr(tok, "unk_token_id", None))
                         if t is not None), None)
        if mask is None or not 0 <= mask < target.vocab_size:
            raise UserError(f"drafter.mask_token_id {mask}: set it to a token id in 0..{target.vocab_size - 1} that "
                             "the data never needs predicted (the tokenizer has no pad or unk token to default to)")
        return int(mask)

    @classmethod
    def build_parts(cls, cfg, target, token_counts):
        """Shared by from_target of dflash and dspark: (layer config, aux ids, d2t, t2d, mask id)."""
        cls.check_options(cfg, target)
        aux = cls.feature_layers_for(cfg, target)
        layer_cfg = draft_layer_config(target.config, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size,
                                       sliding_window=cfg.sliding_window)
        d2t, t2d = draft_vocabulary(cfg.draft_vocab_size, target.vocab_size, token_counts)
        return layer_cfg, aux, d2t, t2d, cls.resolve_mask_token(cfg, target)

    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "BlockDrafting":
        layer_cfg, aux, d2t, t2d, mask = cls.build_parts(cfg, target, token_counts)
        drafter = cls(cfg, layer_cfg, aux, d2t.shape[0], target.vocab_size, target.embed_tokens, mask)
        drafter.finish_init(target, d2t, t2d)
        return drafter.to(device=target.device)

    def finish_init(self, target, d2t, t2d) -> None:
        with torch.no_grad():
            self.d2t.copy_(d2t)
            self.t2d.copy_(t2d)
            self.lm_head.weight.copy_(target.lm_head.weight[self.draft_ids()].float())

    @classmethod
    def feature_layers_for(cls, cfg, target) -> list[int]:
        return resolve_aux_layer_ids(cfg.aux_layer_ids, target.num_layers)

    def draft_ids(self) -> torch.Tensor:
        """[dv] target ids of the draft vocabulary."""
        return draft_ids_of(self.d2t)

    # ------------------------------------------------------------------ the block forward
    def context(self, aux: torch.Tensor) -> torch.Tensor:
        """[b, c, n*h] target hidden states -> [b, c, h] context features."""
        return self.hidden_norm(self.fc(aux.to(self.fc.weight.dtype)))

    def context_kv(self, ctx: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """[b, c, h] context features at [b, c] positions -> per layer (k, v) [b, KV, c, d]."""
        cos, sin = self.rotary(ctx, positions)
        return [layer.self_attn.keys_values(ctx, cos, sin) for layer in self.layers]

    def block_hidden(self, block_ids, block_pos, ctx_kv, mask=None) -> torch.Tensor:
        """block_ids/block_pos [b, n], ctx_kv per layer [b, KV, c, d], mask [b, 1, n, c + n] -> [b, n, h]
        after the final norm (the lm_head input)."""
        x = self.embed_tokens[0](block_ids).to(self.fc.weight.dtype)  # [b, n] -> [b, n, h]
        cos, sin = self.rotary(x, block_pos)
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, k, v, mask)
        return self.norm(x)

    def block_inputs(self, ids: torch.Tensor, anchors: torch.Tensor):
        """ids [b, s], anchors [b, A] -> block ids and positions [b, A*B]: [x_p, MASK...] at p .. p+B-1."""
        B = self.block_size
        offsets = torch.arange(B, device=ids.device)
        pos = (anchors[..., None] + offsets).flatten(1)  # [b, A] -> [b, A*B]
        block = torch.full_like(pos, self.mask_token_id)
        block[:, ::B] = ids.gather(1, anchors)  # slot 0 of each block: the anchor token
        return block, pos

    def training_mask(self, anchors: torch.Tensor, attention_mask: torch.Tensor,
                      documents: torch.Tensor | None = None) -> torch.Tensor:
        """[b, A] anchors -> [b, 1, A*B, s + A*B] bool: block j sees context positions < its anchor (with
        drafter.sliding_window W: >= anchor - W too; real tokens only, of the anchor's document when packed:
        documents [b, s]) and its own B slots."""
        b, A = anchors.shape
        s, B = attention_mask.shape[1], self.block_size
        j = torch.arange(s, device=anchors.device)
        ctx = (j[None, None, :] < anchors[..., None]) & attention_mask.bool()[:, None, :]  # [b, A, s]
        if self.cfg.sliding_window is not None:  # only the sliding_window positions before the anchor
            ctx &= j[None, None, :] >= anchors[..., None] - self.cfg.sliding_window
        if documents is not None:
            ctx &= documents[:, None, :] == documents.gather(1, anchors)[..., None]
        ctx = ctx.repeat_interleave(B, dim=1)  # [b, A*B, s]
        blk = torch.arange(A * B, device=anchors.device) // B
        own = (blk[:, None] == blk[None, :]).expand(b, -1, -1)  # [b, A*B, A*B]
        return torch.cat([ctx, own], dim=2)[:, None]  # -> [b, 1, A*B, s + A*B]

    def blocks_hidden(self, batch, anchors: torch.Tensor) -> torch.Tensor:
        """All blocks at anchors [b, A] in one forward -> final hidden [b, A, B, h] (the lm_head input)."""
        ids = batch["input_ids"]
        b, s = ids.shape
        ctx = self.context(batch["aux_hidden_states"])  # [b, s, n*h] -> [b, s, h]
        ctx_kv = self.context_kv(ctx, torch.arange(s, device=ids.device).expand(b, s))
        block, pos = self.block_inputs(ids, anchors)
        mask = self.training_mask(anchors, batch["attention_mask"], packing.document_ids_of(batch))
        hidden = self.block_hidden(block, pos, ctx_kv, mask)
        return hidden.view(b, anchors.shape[1], self.block_size, -1)  # [b, A*B, h] -> [b, A, B, h]

    def block_logits(self, batch, anchors: torch.Tensor) -> torch.Tensor:
        """-> the backbone's draft logits [b, A, B, dv] of every block (DFlash: slot 0 unused)."""
        return self.lm_head(self.blocks_hidden(batch, anchors))

    # ------------------------------------------------------------------ training
    def valid_anchors(self, batch) -> torch.Tensor:
        """[b, s] bool: p may anchor a block when p >= 1 and its first drafted token x_{p+1} is a loss token
        (packed rows: p >= 1 and x_{p+1} within p's document)."""
        m = (batch["loss_mask"] * batch["attention_mask"]).bool()
        valid = torch.zeros_like(m)
        valid[:, 1:-1] = m[:, 2:]
        if "position_ids" in batch:
            valid &= batch["position_ids"] >= 1
            valid[:, :-1] &= packing.valid_labels(batch, 1, m.shape[1] - 1).bool()  # x_{p+1} in p's document
        return valid

    def anchors_for(self, batch):
        gen = None if self.training else torch.Generator().manual_seed(0)  # held-out loss: the same blocks every time
        return sample_anchors(self.valid_anchors(batch), self.cfg.num_anchors, gen)

    def labels(self, batch, anchors, anchor_ok):
        """-> p [b, A, B, dv] (the target's distribution for slot i's token, restricted to the draft
        vocabulary), top [b, A, B] target argmax ids, mask [b, A, B] (slots whose token is a loss token).
        Slot i predicts x_{p+i} (DFlash; slot 0 predicts nothing) or x_{p+i+1} (sample_from_anchor)."""
        b, s = batch["input_ids"].shape
        B = self.block_size
        shift = int(self.sample_from_anchor)
        pos = anchors[..., None] + torch.arange(B, device=anchors.device) + shift  # [b, A, B]: predicted positions
        inside = pos < s
        src = (pos - 1).clamp(0, s - 1)  # the target position whose next token is the predicted one
        m = (batch["loss_mask"] * batch["attention_mask"]).float()
        mask = m.gather(1, pos.clamp(max=s - 1).flatten(1)).view_as(pos) * inside * anchor_ok[..., None]
        documents = packing.document_ids_of(batch)
        if documents is not None:  # packed: only labels in the anchor's document
            mask = mask * (documents.gather(1, pos.clamp(max=s - 1).flatten(1)).view_as(pos)
                           == documents.gather(1, anchors)[..., None])
        if not shift:
            mask[..., 0] = 0  # slot 0 is the anchor: no prediction
        # restricted to the draft vocabulary before any fp32 copy: [b, s, V] -> [b, A*B, dv] fp32, [b, A*B]
        p, top = vocab_loss.gathered_soft_labels(batch["target_logits"], src.flatten(1), self.draft_ids())
        return p.view(*pos.shape, -1), top.view_as(pos), mask  # [b, A, B, dv], [b, A, B], [b, A, B]

    def token_loss(self, logq: torch.Tensor, p: torch.Tensor, top: torch.Tensor, mask: torch.Tensor):
        """The token loss of drafter.loss: logq, p [b, A, B, dv], top, mask [b, A, B] -> (per-slot loss
        [b, A, B], its weights [b, A, B]: mask times the fixed decay (kl) or D-PACE's (dpace, CE on argmax))."""
        if self.cfg.loss == "dpace":
            ce, confidence = dpace.hard_ce(logq, top, self.draft_ids())
            return ce, dpace.dpace_weights(confidence, mask, self.cfg.dpace_alpha)
        kl = (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1)  # [b, A, B]
        return kl, mask * self.slot_weights(kl.device)

    def slot_weights(self, device) -> torch.Tensor:
        """[B]: the j-th predicting slot weighs exp(-j / gamma); DFlash's anchor slot weighs 0."""
        i = torch.arange(self.block_size, device=device, dtype=torch.float32)
        if self.sample_from_anchor:
            return torch.exp(-i / self.cfg.loss_decay_gamma)
        w = torch.exp(-(i - 1).clamp(min=0) / self.cfg.loss_decay_gamma)
        w[0] = 0.0
        return w


# --------------------------------------------------------------------------- options
@dataclass
class BlockConfig:
    """Options of the block drafters (DFlash; DSpark adds its Markov and confidence heads)."""

    # Target layer ids whose hidden states are fused (hidden_states[i] = input of layer i); None:
    # EAGLE-3's low/mid/high rule. The paper uses 5 layers spread from shallow to deep on 8B.
    aux_layer_ids: Optional[list[int]] = None
    # Tokens per block: DFlash's slot 0 is the anchor, so one forward drafts block_size - 1 tokens.
    block_size: int = 8
    # Draft decoder layers (the paper: 5 on Qwen3-8B; 1-2 suffice on tiny targets).
    num_layers: int = 1
    # Blocks trained per sequence (anchors drawn at random among loss positions). 128 since issue 21: more
    # blocks per step was the largest single gain at a fixed step budget (docs/benchmarks-history.md,
    # "DFlash ablation"); speculators trains up to 512 per packed row; the step's cost grows ~linearly.
    num_anchors: int = 128
    # DFlash: slot i's loss weight is exp(-(i - 1) / loss_decay_gamma) (the paper: 7 for B=16, 4 for B=8).
    loss_decay_gamma: float = 4.0
    # Token id that fills the masked slots; None: the tokenizer's pad (else unk) id.
    mask_token_id: Optional[int] = None
    # Draft vocabulary size (most frequent training-target tokens); None: full vocabulary.
    draft_vocab_size: Optional[int] = None
    # Train lm_head (initialised from the target's rows); False keeps it frozen, as the paper does.
    train_lm_head: bool = False
    # Normal(0, init_std) for fc and the draft layers' linear weights (HF's initializer_range, which
    # speculators' post_init applies); None keeps torch's default (Kaiming-uniform) init.
    init_std: Optional[float] = None
    # Draft layer shape; None copies the target's.
    num_heads: Optional[int] = None
    num_kv_heads: Optional[int] = None
    intermediate_size: Optional[int] = None
    # Token loss: "kl" = forward KL(p || q) to the target's distribution, slot i weighted by the fixed decay
    # above; "dpace" = cross-entropy on the target's argmax weighted by D-PACE (heads/dpace.py: the draft's own
    # detached confidences, aiming at the expected accepted block length; speculators' and Model Optimizer's
    # DFlash default; loss_decay_gamma is then unused for the tokens). D-PACE since issue 21: over 3 seeds on
    # bench_peers_block.py's protocol at 300 steps, DFlash 1.898 against KL's 1.787 and DSpark 2.238 against
    # 2.100 (docs/benchmarks.md, "D-PACE inside draftsmith"); DFlash 2 keeps "kl" (D-PACE gained it ~0.01).
    loss: Literal["kl", "dpace"] = "dpace"
    # D-PACE's smoothing alpha in (0, 1]: s_i = (1 - alpha) q_i + alpha (all three peers: 0.5).
    dpace_alpha: float = 0.5
    # Attention window: a block anchored at p sees the context features of the sliding_window positions
    # p - sliding_window .. p - 1 (and its own slots), in training's mask and the loop alike (speculators'
    # DFlash window); null: every position before the anchor.
    sliding_window: Optional[int] = None

    def problems(self) -> list[str]:
        """Ranges `config.load` and `draftsmith validate` report (one message per bad option)."""
        return range_problems(self, {"block_size": f">= 2 and <= {MAX_DRAFT_TOKENS + 1}", "num_layers": ">= 1", "num_anchors": ">= 1",
                                     "loss_decay_gamma": "> 0", "mask_token_id": ">= 0", "draft_vocab_size": ">= 2",
                                     "num_heads": ">= 1", "num_kv_heads": ">= 1", "intermediate_size": ">= 1",
                                     "dpace_alpha": "> 0 and <= 1", "sliding_window": ">= 1",
                                     "aux_layer_ids": ">= 0", "init_std": "> 0"}) + aux_layer_problems(self.aux_layer_ids)



@torch.no_grad()
def slot_metrics(logq, kl, top, mask, draft_ids, start: int) -> dict[str, float]:
    """Per block slot (acc_0 = the first drafted token): accuracy against the target's argmax and loss."""
    hit = (draft_ids[logq.argmax(-1)] == top).float()  # [b, A, B]
    metrics = {}
    for i in range(start, mask.shape[-1]):
        m = mask[..., i]
        denom = m.sum().clamp_min(1.0)
        metrics[f"acc_{i - start}"] = float((hit[..., i] * m).sum() / denom)
        metrics[f"loss_{i - start}"] = float((kl[..., i] * m).sum() / denom)
    return metrics


class BlockProposer:
    """Single-pass block drafting: each round ONE drafter forward over [last committed token, MASK...]
    proposes up to one block of tokens (fewer when the loop asks for fewer, or DSpark's confidence head).

    The drafter keeps, per layer, the keys/values of the context features of every committed position
    but the newest (its target hidden state arrives with the next verification). Speculative positions
    are never cached, so commit() only appends; nothing is rolled back.
    """

    name = "dflash"

    def __init__(self, drafter: BlockDrafting, target):
        self.drafter = drafter
        self.name = drafter.kind
        self.vocab_size = target.vocab_size
        self.draft_ids = drafter.draft_ids()

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.ctx_kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        self.committed = 0  # context features held = committed tokens - 1

    @torch.no_grad()
    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        d = self.drafter
        aux = torch.cat([target_out.hidden_states[i] for i in d.aux_layer_ids], dim=-1)  # [1, m, n*h]
        pos = torch.arange(self.committed, self.committed + num_new, device=aux.device).view(1, -1)
        new = d.context_kv(d.context(aux), pos)  # per layer [1, KV, m, d]
        if self.ctx_kv is None:
            self.ctx_kv = new
        else:
            self.ctx_kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(self.ctx_kv, new)]
        self.committed += num_new

    def block_hidden(self, context: torch.Tensor) -> torch.Tensor:
        """-> [B, h] final hidden of one block anchored at the newest committed token (ONE forward)."""
        d = self.drafter
        dev = self.draft_ids.device
        block = torch.full((1, d.block_size), d.mask_token_id, dtype=torch.long, device=dev)
        block[0, 0] = context[-1]
        pos = torch.arange(self.committed, self.committed + d.block_size, device=dev).view(1, -1)
        ctx_kv = self.ctx_kv
        if d.cfg.sliding_window is not None:  # the newest sliding_window context features only (as training's mask)
            ctx_kv = [(k[:, :, -d.cfg.sliding_window:], v[:, :, -d.cfg.sliding_window:]) for k, v in ctx_kv]
        return d.block_hidden(block, pos, ctx_kv)[0]  # no mask: the block sees all of that context

    def block_logits(self, context: torch.Tensor) -> torch.Tensor:
        """-> [B, dv] the backbone's draft logits of that block."""
        return self.drafter.lm_head(self.block_hidden(context))

    def target_probs(self, draft_logits: torch.Tensor, sampling) -> torch.Tensor:
        """[n, dv] draft logits -> [n, V] probabilities over the target vocabulary (same transform as p)."""
        return logits_to_probs(on_target_vocab(draft_logits.float(), self.draft_ids, self.vocab_size), sampling)

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        """One block forward, then the kind turns its hidden states into drafts (DSpark: Markov chain
        over the slots, and a confidence head that may send fewer than k to verification)."""
        return self.drafter.draft_block(self.block_hidden(context), context[-1], k, self, sampling, generator)
