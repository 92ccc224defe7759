"""DFlash drafter (Chen, Liang, Liu et al. 2026, "DFlash: Block Diffusion for Flash Speculative
Decoding", arXiv:2602.06036): a small block-diffusion model that drafts a whole block of tokens in
ONE forward pass, conditioned on the target's hidden states.

The backbone, the training blocks and the proposer are the block-drafter family's (heads/block.py).
DFlash's own choices: slot 0 of a block is the anchor x_p and slot i = 1..B-1 predicts x_{p+i}, its label
the target's distribution at p+i-1, so one forward drafts B-1 tokens (speculators' sample_from_anchor =
false); slot i's KL weighs exp(-(i-1) / gamma) (the paper's per-position decay) unless drafter.loss is dpace.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.core.sampling import sample
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, StepOutput
from draftsmith.heads.block import BlockConfig, BlockDrafting, BlockProposer, slot_metrics


# --------------------------------------------------------------------------- the drafter
@DRAFTERS.register("dflash")
class DFlashDrafter(BlockDrafting, Drafter):
    kind = "dflash"
    drafts_block = True
    uses_draft_rope = True
    tiny_options = {"block_size": 4, "num_layers": 1, "num_anchors": 4}  # one forward drafts 3
    takes_topk_labels = True  # target_logits only through vocab_loss (BlockDrafting.labels): features.label_topk
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"})

    @dataclass
    class Config(BlockConfig):
        """DFlash's options: the block options DSpark and DFlash 2 share (BlockConfig's defaults)."""

    def __init__(self, cfg, layer_config, aux_layer_ids: list[int], draft_vocab_size: int, target_vocab_size: int,
                 embed_tokens: nn.Embedding, mask_token_id: int):
        super().__init__()
        self.build_modules(cfg, layer_config, aux_layer_ids, draft_vocab_size, target_vocab_size, embed_tokens,
                           mask_token_id)

    def forward_loss(self, batch) -> StepOutput:
        """DFlash training (the paper's section 4), numbered:

        1. sample up to num_anchors anchors per sequence among positions whose next token is a loss token;
        2. build every block [x_p, MASK...] and run all of them in ONE forward, each block seeing the fused
           target features before its anchor and itself (block-sparse mask);
        3. loss of slot i = forward KL(p || q) against the target's distribution for x_{p+i}, weighted by
           exp(-(i - 1) / gamma) (or, with loss=dpace, CE on its argmax weighted by D-PACE), summed over
           loss tokens (normalised by the caller, see StepOutput).
        """
        anchors, ok = self.anchors_for(batch)  # 1. [b, A]
        logq = torch.log_softmax(self.block_logits(batch, anchors).float(), dim=-1)  # 2. [b, A, B, dv]
        p, top, mask = self.labels(batch, anchors, ok)
        loss, weights = self.token_loss(logq, p, top, mask)  # 3. [b, A, B] each
        total = (loss * weights).sum()
        return StepOutput(loss=total, metrics=slot_metrics(logq, loss, top, mask, self.draft_ids(), start=1),
                          num_tokens=int(mask.sum()))

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> "BlockProposer":
        return BlockProposer(self, target)

    def draft_block(self, hidden: torch.Tensor, anchor: torch.Tensor, k: int, proposer, sampling, generator) -> Draft:
        """hidden [B, h] of one block -> up to block_size - 1 drafts; each slot is drawn from its own
        marginal q_i (stochastic verification only needs q_i to be the distribution x_i was drawn from)."""
        n = min(k, self.block_size - 1)
        q = proposer.target_probs(self.lm_head(hidden[1 : 1 + n]), sampling)  # [n, V]
        tokens = q.argmax(-1) if sampling.greedy else sample(q, generator)  # [n]
        return Draft(tokens=tokens, probs=q)
