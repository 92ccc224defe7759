"""DFlash 2 drafter (Inco AI and Z Lab, "DFlash 2", technical blog https://inco.ai/blog/dflash2/,
2026-08-18; reference implementation z-lab/dflash dflash/model.py; trained by speculators 0.9.0 as
models/dflash2): the DFlash block backbone (heads/block.py) plus two small pieces that recover what a
purely parallel block draft loses, both still inside ONE backbone forward per round.

1. Two-tap dynamic convolution around every sublayer. Each draft layer wraps its attention and its MLP
   in a grouped, token-conditioned causal convolution over the block's slots:
       out[t, c] = sum_j (base[j, c] + delta[t, j, g(c)]) * x[t - j, c],   j = 0 .. K-1 (K = 2 taps),
   with taps that never cross a block boundary (x[t - j] counts only when t - j is in the same block),
   g(c) = c // group_size, and delta = kernel_projection(x_normed) (one projection of the sublayer's
   normed input gives the kernels of both the input and the output convolution). base starts as the
   identity (tap 0 = 1) and the projection at zero, so a fresh DFlash 2 computes exactly DFlash.
   Slot t thereby sees slot t-1 without another pass (the blog's fix for "suffix decay").
2. Pairwise candidate selector. Keep the unary (lm_head) top-K candidates of every slot and score each
   candidate c of slot t given the token a before it:
       S_t(a, c) = U_t(c) + < A[a] * (W h_t), B[c] >      (A, B: rank-r codebooks, W: [h -> r]),
   then walk the block left to right from the verified anchor: greedy picks argmax_c S_t(prev, c); sampled
   decoding draws from softmax_c S_t(prev, c) over the K candidates, which is the q it reports (exact for
   stochastic verification). Only this walk is sequential; the backbone ran once.

Training (speculators 0.9.0 models/dflash2/core.py and metrics.py, written anew here), numbered in
forward_loss: DFlash's anchors and blocks; unary loss = forward KL to the target's distribution with
DFlash's slot weights exp(-(i - 1) / gamma) (or, with drafter.loss=dpace, DFlash's D-PACE); selector
loss = K-way cross entropy of the target's argmax among the unary top-K, teacher-forced (the previous
token is the ground truth x_{p+i-1}); when the argmax is not among them it replaces the K-th candidate
(training only; serving keeps the unary top-K); the fixed slot weights; total = unary + selector_weight
* selector.

Slots as DFlash (sample_from_anchor = false, which speculators and the engines require for DFlash 2):
slot 0 is the anchor, slot i = 1..B-1 predicts x_{p+i}. Tensor names follow z-lab's / speculators':
layers.{i}.{attention_conv, mlp_conv}.{base_kernel, kernel_projection.weight},
candidate_selector.{predecessor_codebook, successor_codebook, hidden_projection.weight}.

Reference numbers (the blog, quoted by speculators issue #1014; per-request mean acceptance length,
Qwen3.5-4B target): GSM8K MTP 4.78, DFlash 4.99, DSpark 5.69, DFlash 2 6.20; MATH-500 5.04 / 5.42 /
6.20 / 6.76. On Qwen3-4B GSM8K the blog reports per-slot recall@1 85.4 % against 99.5 % recall@16
(an oracle selector would lift acceptance length 4.27 -> 6.79).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import sample
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, StepOutput, range_problems
from draftsmith.heads.block import BlockConfig, BlockDrafting, BlockLayer, BlockProposer, slot_metrics


# --------------------------------------------------------------------------- 1. dynamic convolution
def dynamic_conv(x: torch.Tensor, delta: torch.Tensor, base: torch.Tensor, block_size: int) -> torch.Tensor:
    """Grouped token-conditioned causal convolution inside blocks (the blog's Conv_k).

    x [b, n, h] with n a multiple of block_size (consecutive blocks), delta [b, n, K, G] (per-slot kernel
    offsets, one per channel group of h // G channels), base [K, h] -> [b, n, h]:
    out[t] = sum_j (base[j] + delta[t, j, group]) * x[t - j], taps j with (t mod block_size) >= j only."""
    b, n, h = x.shape
    K, G = base.shape[0], delta.shape[-1]
    slot = torch.arange(n, device=x.device) % block_size  # [n]: position inside its block
    out = torch.zeros_like(x)
    for j in range(K):
        shifted = x if j == 0 else torch.cat([x.new_zeros(b, j, h), x[:, :-j]], dim=1)  # x[t - j]
        coeff = base[j].to(x.dtype) + delta[:, :, j].repeat_interleave(h // G, dim=-1)  # [b, n, G] -> [b, n, h]
        out = out + shifted * coeff * (slot >= j).to(x.dtype)[None, :, None]  # no tap across a block boundary
    return out


class DynamicConv(nn.Module):
    """The input and the output convolution of one sublayer, driven by one projection of its normed input."""

    def __init__(self, hidden: int, block_size: int, kernel_size: int, group_size: int):
        super().__init__()
        self.block_size, self.kernel_size, self.num_groups = block_size, kernel_size, hidden // group_size
        self.base_kernel = nn.Parameter(torch.zeros(2, kernel_size, hidden))  # [in/out, K, h]
        self.kernel_projection = nn.Linear(hidden, 2 * kernel_size * self.num_groups, bias=False)
        with torch.no_grad():  # identity: a fresh DFlash 2 layer computes DFlash's
            self.base_kernel[:, 0] = 1.0
            self.kernel_projection.weight.zero_()

    def prepare(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [b, n, h] (the sublayer's normed input) -> (its input convolution [b, n, h], output delta [b, n, K, G])."""
        deltas = self.kernel_projection(x).view(*x.shape[:-1], 2, self.kernel_size, self.num_groups)
        return dynamic_conv(x, deltas[..., 0, :, :], self.base_kernel[0], self.block_size), deltas[..., 1, :, :]

    def finish(self, y: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """y [b, n, h] (the sublayer's output) -> its output convolution [b, n, h]."""
        return dynamic_conv(y, delta, self.base_kernel[1], self.block_size)


class ConvBlockLayer(BlockLayer):
    """DFlash's block layer with each sublayer wrapped: x + conv_out(sublayer(conv_in(norm(x))))."""

    def __init__(self, config, block_size: int, kernel_size: int, group_size: int):
        super().__init__(config)
        h = config.hidden_size
        self.attention_conv = DynamicConv(h, block_size, kernel_size, group_size)
        self.mlp_conv = DynamicConv(h, block_size, kernel_size, group_size)

    def forward(self, x, cos, sin, ctx_k, ctx_v, mask=None):
        a, delta = self.attention_conv.prepare(self.input_layernorm(x))
        x = x + self.attention_conv.finish(self.self_attn(a, cos, sin, ctx_k, ctx_v, mask), delta)
        m, delta = self.mlp_conv.prepare(self.post_attention_layernorm(x))
        return x + self.mlp_conv.finish(self.mlp(m), delta)


# --------------------------------------------------------------------------- 2. candidate selector
class CandidateSelector(nn.Module):
    """S(a, c | h) = U(c) + <A[a] * (W h), B[c]>: predecessor codebook A [V_target, r] (the previous token is
    a target id), successor codebook B [dv, r] (candidates are draft-vocabulary indices), W [h -> r]."""

    def __init__(self, target_vocab_size: int, draft_vocab_size: int, hidden: int, rank: int, std: float = 0.02):
        super().__init__()
        self.predecessor_codebook = nn.Parameter(torch.randn(target_vocab_size, rank) * std)
        self.successor_codebook = nn.Parameter(torch.randn(draft_vocab_size, rank) * std)
        self.hidden_projection = nn.Linear(hidden, rank, bias=False)
        nn.init.normal_(self.hidden_projection.weight, std=std)

    def scores(self, unary: torch.Tensor, hidden: torch.Tensor, prev: torch.Tensor, cands: torch.Tensor):
        """unary [..., dv], hidden [..., h], prev [...] target ids, cands [..., K] draft indices -> [..., K]."""
        ctx = self.predecessor_codebook[prev] * self.hidden_projection(hidden).to(self.predecessor_codebook.dtype)
        pair = (ctx.unsqueeze(-2) * self.successor_codebook[cands]).sum(-1)  # [..., 1, r] x [..., K, r] -> [..., K]
        return unary.gather(-1, cands) + pair.to(unary.dtype)


def training_candidates(unary: torch.Tensor, label: torch.Tensor, top_k: int):
    """unary [..., dv] logits, label [...] draft index -> (candidates [..., K], label's place [...], found [...]):
    the unary top-K, with the label put in the K-th place where it is missing (found False there)."""
    cands = unary.detach().topk(top_k, dim=-1).indices  # [..., K]
    hit = cands == label[..., None]
    found = hit.any(-1)
    cands[..., -1] = torch.where(found, cands[..., -1], label)
    place = torch.where(found, hit.long().argmax(-1), torch.full_like(label, top_k - 1))
    return cands, place, found


# --------------------------------------------------------------------------- the drafter
@DRAFTERS.register("dflash2")
class DFlash2Drafter(BlockDrafting, Drafter):
    kind = "dflash2"
    drafts_block = True
    uses_draft_rope = True
    tiny_options = {"block_size": 4, "num_layers": 1, "num_anchors": 4, "selector_rank": 8, "selector_top_k": 4,
                    "conv_group_size": 8}
    takes_topk_labels = True  # target_logits only through vocab_loss (BlockDrafting.labels): features.label_topk
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"})

    @dataclass
    class Config(BlockConfig):
        """DFlash's block options (block.BlockConfig) plus the convolution and the selector."""

        # Taps of the dynamic convolution (the blog: 2, the slot itself and the one before it).
        conv_kernel_size: int = 2
        # Hidden channels sharing one dynamic kernel (the blog and speculators: 16); must divide the width.
        conv_group_size: int = 16
        # Rank r of the selector's codebooks (the blog and speculators: 256; tiny targets need far less).
        selector_rank: int = 32
        # Unary candidates the selector reranks per slot (the blog and speculators: 16).
        selector_top_k: int = 16
        # Weight of the selector's K-way cross entropy (speculators' selector_loss_alpha).
        selector_weight: float = 1.0
        # Unary token loss: "kl" (forward KL, fixed decay) or "dpace" (DFlash's default; on DFlash 2 it moved
        # tau by only +0.01 / +0.02 over 3 seeds, docs/benchmarks.md "DFlash 2 with D-PACE, 3 seeds"); the
        # selector's cross entropy keeps the fixed decay either way.
        loss: Literal["kl", "dpace"] = "kl"

        def problems(self) -> list[str]:
            found = super().problems() + range_problems(self, {
                "conv_kernel_size": ">= 1", "conv_group_size": ">= 1", "selector_rank": ">= 1",
                "selector_top_k": ">= 1", "selector_weight": ">= 0"})
            if self.conv_kernel_size > self.block_size:
                found.append(f"drafter.conv_kernel_size {self.conv_kernel_size}: at most block_size "
                             f"({self.block_size}); taps never cross a block boundary")
            return found

    def __init__(self, cfg, layer_config, aux_layer_ids: list[int], draft_vocab_size: int, target_vocab_size: int,
                 embed_tokens: nn.Embedding, mask_token_id: int):
        super().__init__()
        self.build_modules(cfg, layer_config, aux_layer_ids, draft_vocab_size, target_vocab_size, embed_tokens,
                           mask_token_id)
        self.top_k = cfg.selector_top_k
        self.candidate_selector = CandidateSelector(target_vocab_size, draft_vocab_size, layer_config.hidden_size,
                                                    cfg.selector_rank)

    def make_layer(self, layer_config) -> nn.Module:
        return ConvBlockLayer(layer_config, self.cfg.block_size, self.cfg.conv_kernel_size, self.cfg.conv_group_size)

    @classmethod
    def check_options(cls, cfg, target) -> None:
        super().check_options(cfg, target)
        if target.hidden_size % cfg.conv_group_size:
            raise UserError(f"drafter.conv_group_size {cfg.conv_group_size}: must divide the target's hidden size "
                             f"{target.hidden_size}; pick a divisor such as 16, 8 or 4")
        if not 1 <= cfg.conv_kernel_size <= cfg.block_size:
            raise UserError(f"drafter.conv_kernel_size {cfg.conv_kernel_size}: needs 1 <= taps <= block_size "
                             f"{cfg.block_size}")
        dv = cfg.draft_vocab_size or target.vocab_size
        if cfg.selector_top_k > dv:
            raise UserError(f"drafter.selector_top_k {cfg.selector_top_k}: at most the draft vocabulary ({dv})")

    # ------------------------------------------------------------------ training
    def forward_loss(self, batch) -> StepOutput:
        """DFlash 2 training, numbered:

        1. anchors and blocks as DFlash: one backbone forward (with its convolutions) for all blocks;
        2. unary loss: forward KL(p || q) of each slot against the target's distribution, weighted by
           exp(-(i - 1) / gamma) (slot 0, the anchor, weighs 0); with loss=dpace, CE on the target's argmax
           weighted by D-PACE (DFlash's token_loss);
        3. selector candidates: the unary top-K, the target's argmax (over the draft vocabulary) put in the
           K-th place where it is missing;
        4. teacher forcing: slot i's previous token is the ground truth x_{p+i-1} (the anchor for slot 1);
        5. selector loss: cross entropy of the argmax's place among the K scores S_i(prev, c), weighted by
           the fixed decay of 2.;
        total = unary + selector_weight * selector, summed over loss tokens (the caller normalises).
        """
        ids = batch["input_ids"]
        anchors, ok = self.anchors_for(batch)  # 1. [b, A]
        hidden = self.blocks_hidden(batch, anchors)  # [b, A, B, h]
        unary = self.lm_head(hidden)  # [b, A, B, dv]
        logq = torch.log_softmax(unary.float(), dim=-1)
        p, top, mask = self.labels(batch, anchors, ok)
        w = mask * self.slot_weights(mask.device)
        token, token_w = self.token_loss(logq, p, top, mask)  # 2. [b, A, B]: KL (weights w) or CE (D-PACE's)
        label = p.argmax(-1)  # 3. [b, A, B] draft index of the target's most likely token
        cands, place, found = training_candidates(unary, label, self.top_k)
        slot = (torch.arange(self.block_size, device=ids.device) - 1).clamp(min=0)  # 4. slot i reads x_{p+i-1}
        prev = ids.gather(1, (anchors[..., None] + slot).clamp(max=ids.shape[1] - 1).flatten(1)).view_as(label)
        scores = self.candidate_selector.scores(unary, hidden, prev, cands).float()  # [b, A, B, K]
        ce = -torch.log_softmax(scores, -1).gather(-1, place[..., None]).squeeze(-1)  # 5. [b, A, B]
        total = (token * token_w).sum() + self.cfg.selector_weight * (ce * w).sum()
        metrics = slot_metrics(logq, token, top, mask, self.draft_ids(), start=1)
        with torch.no_grad():
            denom = mask.sum().clamp_min(1.0)
            picked = cands.gather(-1, scores.argmax(-1, keepdim=True)).squeeze(-1)
            metrics["candidate_recall"] = float((found * mask).sum() / denom)
            metrics["selector_acc"] = float(((picked == label) & found).float().mul(mask).sum() / denom)
            metrics["selector_loss"] = float((ce * mask).sum() / denom)
        return StepOutput(loss=total, metrics=metrics, num_tokens=int(mask.sum()))

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> BlockProposer:
        return BlockProposer(self, target)

    def draft_block(self, hidden: torch.Tensor, anchor: torch.Tensor, k: int, proposer, sampling, generator) -> Draft:
        """hidden [B, h] of one block -> up to block_size - 1 drafts, walking the selector left to right:
        1. slot i's candidates: the unary top-K of lm_head(hidden[i]);
        2. their scores S_i(prev, c), prev = the anchor for slot 1, then the token drafted before;
        3. q_i = the sampling transform of softmax over the K scores (-inf elsewhere); greedy takes its argmax,
           sampling draws from it, so q_i is exactly the distribution x_i was drawn from."""
        n = min(k, self.block_size - 1)
        unary = self.lm_head(hidden[1 : 1 + n])  # [n, dv]
        cands = unary.topk(self.top_k, dim=-1).indices  # 1. [n, K]
        prev = anchor.view(1).to(hidden.device)
        tokens, probs = [], []
        for i in range(n):
            s = self.candidate_selector.scores(unary[i : i + 1], hidden[1 + i : 2 + i], prev, cands[i : i + 1])  # 2.
            logits = unary.new_full((1, unary.shape[-1]), float("-inf")).scatter(-1, cands[i : i + 1], s)  # [1, dv]
            q = proposer.target_probs(logits, sampling)  # 3. [1, V]
            prev = q.argmax(-1) if sampling.greedy else sample(q, generator)  # [1] target id
            tokens.append(prev)
            probs.append(q)
        return Draft(tokens=torch.cat(tokens), probs=torch.cat(probs))
