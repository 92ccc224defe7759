"""DSpark drafter (DeepSeek and PKU 2026, "DSpark: Confidence-Scheduled Speculative Decoding with
Semi-Autoregressive Generation", the DeepSpec release; speculators.models.dspark): the DFlash block
backbone (heads/block.py) plus two small heads.

- Markov head: a low-rank logit bias B = W2 W1[prev] added to each slot's logits, where prev is the
  token before the slot (the anchor for slot 0, then the token drafted at the previous slot). The
  block is still ONE backbone forward; only this bias is applied left to right, so each draft
  conditions on the one actually drafted before it (adjacent-token consistency).
- Confidence head: a linear probe on [slot hidden ; W1[prev]] predicting the slot's acceptance
  probability. In the loop the drafts are cut where the running product of confidences falls below
  `confidence_threshold`: that is the per-round verify length.

Slots (speculators' sample_from_anchor = true, as DeepSpec): block [x_p, MASK...] at positions
p..p+B-1 sees the target's features before p; slot i predicts x_{p+i+1}, so one block drafts B tokens.

Training, as the paper and speculators: forward KL to the target's distribution with the Markov bias
applied on the ground-truth previous token (teacher forcing), slot weight exp(-i / gamma); plus
confidence_weight * BCE(confidence logit, 1 - TV(q, p)) with the same weights, where
1 - TV(q, p) = sum_v min(p_v, q_v) is the slot's exact acceptance probability under stochastic
verification (a detached target).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import sample
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, StepOutput, range_problems
from draftsmith.heads.block import BlockConfig, BlockDrafting, BlockProposer, slot_metrics


class MarkovHead(nn.Module):
    """Low-rank first-order bias: markov_w1 [V_target, r] embeds the previous token, markov_w2 [r -> dv]."""

    def __init__(self, target_vocab_size: int, draft_vocab_size: int, rank: int, zero_init: bool = True):
        super().__init__()
        self.markov_w1 = nn.Embedding(target_vocab_size, rank)
        nn.init.normal_(self.markov_w1.weight, std=0.01)
        self.markov_w2 = nn.Linear(rank, draft_vocab_size, bias=False)  # torch's default init unless zero_init
        if zero_init:
            nn.init.zeros_(self.markov_w2.weight)  # start as pure DFlash: no bias (and no token-loss gradient into w1) yet


class ConfidenceHead(nn.Module):
    def __init__(self, input_dim: int):
        super().__init__()
        self.proj = nn.Linear(input_dim, 1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.proj(features).squeeze(-1)  # [..., h + r] -> [...]


@DRAFTERS.register("dspark")
class DSparkDrafter(BlockDrafting, Drafter):
    kind = "dspark"
    drafts_block = True
    uses_draft_rope = True
    tiny_options = {"block_size": 3, "num_layers": 1, "num_anchors": 4, "markov_rank": 8}
    takes_topk_labels = True  # target_logits only through vocab_loss (BlockDrafting.labels): features.label_topk
    sample_from_anchor = True
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"})

    @dataclass
    class Config(BlockConfig):
        """DFlash's block options (block.BlockConfig) with DSpark's defaults and its two heads."""

        # Tokens per block; every slot predicts (DeepSpec ships block 7), so one forward drafts block_size.
        block_size: int = 7
        # Slot i's loss weight is exp(-i / loss_decay_gamma) (DSpark has no anchor-only slot 0): the token loss's
        # with loss=kl; the confidence head keeps this fixed decay whatever drafter.loss (default D-PACE) is.
        loss_decay_gamma: float = 4.0
        # Low rank r of the Markov bias W2 W1 (DeepSpec and speculators: 256).
        markov_rank: int = 32
        # True starts W2 at zero (a pure-DFlash start; W1 then gets no token-loss gradient until W2 grows); False
        # keeps torch's default init for W2, as speculators does.
        markov_zero_init: bool = True
        # Weight of the confidence head's BCE loss (speculators' confidence_head_alpha).
        confidence_weight: float = 1.0
        # Eval: drafts are sent to verification while the running product of confidences stays >= this;
        # 0 sends every drafted token (the loop's k caps it).
        confidence_threshold: float = 0.3

        def problems(self) -> list[str]:
            return super().problems() + range_problems(self, {"markov_rank": ">= 1", "confidence_weight": ">= 0",
                                                              "confidence_threshold": ">= 0 and < 1"})

    def __init__(self, cfg, layer_config, aux_layer_ids: list[int], draft_vocab_size: int, target_vocab_size: int,
                 embed_tokens: nn.Embedding, mask_token_id: int):
        super().__init__()
        self.build_modules(cfg, layer_config, aux_layer_ids, draft_vocab_size, target_vocab_size, embed_tokens,
                           mask_token_id)
        if cfg.markov_rank < 1:
            raise UserError(f"drafter.markov_rank {cfg.markov_rank}: needs >= 1 (0 is plain DFlash: use kind dflash)")
        self.markov_head = MarkovHead(target_vocab_size, draft_vocab_size, cfg.markov_rank, cfg.markov_zero_init)
        self.confidence_head = ConfidenceHead(layer_config.hidden_size + cfg.markov_rank)

    @classmethod
    def check_options(cls, cfg, target) -> None:
        if cfg.block_size < 1:
            raise UserError(f"drafter.block_size {cfg.block_size}: needs >= 1")
        if cfg.num_layers < 1 or cfg.num_anchors < 1:
            raise UserError(f"drafter.num_layers {cfg.num_layers} / num_anchors {cfg.num_anchors}: need >= 1")
        if not 0.0 <= cfg.confidence_threshold < 1.0:
            raise UserError(f"drafter.confidence_threshold {cfg.confidence_threshold}: needs 0 <= t < 1")

    # ------------------------------------------------------------------ heads
    def heads(self, hidden: torch.Tensor, prev: torch.Tensor):
        """hidden [..., h] (final norm applied), prev [...] previous-token ids -> (logits [..., dv] with the
        Markov bias, confidence logits [...])."""
        e = self.markov_head.markov_w1(prev).to(hidden.dtype)  # [...] -> [..., r]
        logits = self.lm_head(hidden) + self.markov_head.markov_w2(e)
        return logits, self.confidence_head(torch.cat([hidden, e], dim=-1))

    # ------------------------------------------------------------------ training
    def forward_loss(self, batch) -> StepOutput:
        """DSpark training, numbered:

        1. anchors and blocks as DFlash (one forward for all blocks);
        2. slot i's previous token is the ground truth x_{p+i} (teacher forcing); Markov bias and confidence;
        3. token loss: forward KL(p || q) weighted by exp(-i / gamma) (loss=dpace: CE on the argmax, D-PACE weights);
        4. confidence loss: BCE(c_i, 1 - TV(q_i, p_i)) with the same weights, times confidence_weight;
        both summed over loss tokens (the caller normalises, see StepOutput).
        """
        ids = batch["input_ids"]
        anchors, ok = self.anchors_for(batch)  # 1. [b, A]
        hidden = self.blocks_hidden(batch, anchors)  # [b, A, B, h]
        pos = anchors[..., None] + torch.arange(self.block_size, device=ids.device)  # [b, A, B]
        prev = ids.gather(1, pos.clamp(max=ids.shape[1] - 1).flatten(1)).view_as(pos)  # 2. x_{p+i}
        logits, conf = self.heads(hidden, prev)
        logq = torch.log_softmax(logits.float(), dim=-1)  # [b, A, B, dv]
        p, top, mask = self.labels(batch, anchors, ok)
        w = mask * self.slot_weights(mask.device)
        token, token_w = self.token_loss(logq, p, top, mask)  # 3. [b, A, B]: KL (decay w) or CE (D-PACE weights)
        with torch.no_grad():
            accept = torch.minimum(p, logq.exp()).sum(-1)  # 4. 1 - TV(q, p): the exact acceptance probability
        bce = nn.functional.binary_cross_entropy_with_logits(conf.float(), accept, reduction="none")
        total = (token * token_w).sum() + self.cfg.confidence_weight * (bce * w).sum()  # confidence: fixed decay
        metrics = slot_metrics(logq, token, top, mask, self.draft_ids(), start=0)
        with torch.no_grad():
            denom = mask.sum().clamp_min(1.0)
            metrics["confidence_abs_error"] = float(((conf.float().sigmoid() - accept).abs() * mask).sum() / denom)
            metrics["accept_rate"] = float((accept * mask).sum() / denom)
        return StepOutput(loss=total, metrics=metrics, num_tokens=int(mask.sum()))

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> BlockProposer:
        return BlockProposer(self, target)

    def draft_block(self, hidden: torch.Tensor, anchor: torch.Tensor, k: int, proposer, sampling, generator) -> Draft:
        """hidden [B, h] of one block -> drafts, left to right over the slots:
        1. slot i's logits get the Markov bias of the token before it (anchor, then the previous draft);
        2. draw x_i from q_i (q_i conditions on the drafts before it: exact for stochastic verification);
        3. confidence c_i of slot i; stop once prod c_0..c_i < confidence_threshold (x_i still sent:
           at least one token per round). The number sent is this round's verify length."""
        tokens, probs, running = [], [], 1.0
        prev = anchor.view(1).to(hidden.device)
        for i in range(min(k, self.block_size)):
            logits, conf = self.heads(hidden[i : i + 1], prev)  # 1. [1, dv], [1]
            q = proposer.target_probs(logits, sampling)  # [1, V]
            prev = q.argmax(-1) if sampling.greedy else sample(q, generator)  # 2. [1]
            tokens.append(prev)
            probs.append(q)
            running *= float(torch.sigmoid(conf))  # 3.
            if running < self.cfg.confidence_threshold:
                break
        return Draft(tokens=torch.cat(tokens), probs=torch.cat(probs))
