"""EAGLE-1 drafter (Li et al. 2024, "EAGLE: Speculative Sampling Requires Rethinking Feature
Uncertainty"): autoregression at the feature level.

Architecture (tensor names follow the EAGLE repository / vLLM's EAGLE-1 loader):
  fc         [2h -> h], with bias unless drafter.fc_bias=false (vLLM's EAGLE-1 builds fc without one)
             fuses [embedding(x_{j+1}) ; feature f_j]
  layers.0   one Llama decoder layer (draft_layer.DraftDecoderLayer, input size h) without an input
             norm: attention reads fc's output, and the residual is fc's output
  embed_tokens, lm_head   the target's frozen embedding and lm_head (shared, never trained, not in
             checkpoints); the drafter's output is a predicted feature, scored by the target's lm_head

Feature read: last_hidden_state = hidden_states[num_layers], AFTER the target's final norm (the
lm_head input, what the EAGLE repository trained on through HF's hidden_states[-1]). There is no
draft-side final norm: the predicted feature goes straight into the target's lm_head.

Pairing (training and inference alike): drafter position j takes (f_j, x_{j+1}) and predicts
f_{j+1}, whence x_{j+2} = argmax lm_head(f_{j+1}); the regression label is f_{j+1} and the
classification label the target's distribution p_{j+1}. At inference a draft step feeds its own
predicted feature back as the next f (feature-level autoregression).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn

from draftsmith.data import packing
from draftsmith.heads.base import DRAFTERS, Drafter, StepOutput, range_problems
from draftsmith.heads.draft_layer import DraftDecoderLayer, KVCache, draft_layer_config, rotary
from draftsmith.heads.proposing import FeatureChainProposer
from draftsmith.heads.shared import Frozen


@DRAFTERS.register("eagle1")
class Eagle1Drafter(Drafter):
    kind = "eagle1"
    uses_draft_rope = True
    tiny_options = {"fc_bias": False}  # the matrix exports it to vLLM too, whose fc has no bias
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "last_hidden_state", "target_logits"})

    @dataclass
    class Config:
        # Weight of the feature regression (smooth L1, mean over the hidden size) and of the
        # token classification (forward KL to the target's distribution); the paper uses 1.0 and 0.1.
        regression_weight: float = 1.0
        classification_weight: float = 0.1
        # Uniform noise U(-r/2, r/2) added to input features in training mode only (the paper's
        # robustness trick against feature error accumulation); 0 turns it off.
        noise_range: float = 0.2
        # Draft layer shape; None copies the target's.
        num_heads: Optional[int] = None
        num_kv_heads: Optional[int] = None
        intermediate_size: Optional[int] = None
        # fc's bias. vLLM's EAGLE-1 (model_executor/models/llama_eagle.py, 0.9.2 to 0.33) builds fc without a
        # bias, so a drafter meant for vLLM trains with false; SGLang's fc has one (its export writes zeros then).
        fc_bias: bool = True

        def problems(self) -> list[str]:
            """Ranges `config.load` and `draftsmith validate` report (one message per bad option)."""
            out = range_problems(self, {"regression_weight": ">= 0", "classification_weight": ">= 0",
                                        "noise_range": ">= 0", "num_heads": ">= 1", "num_kv_heads": ">= 1",
                                        "intermediate_size": ">= 1"})
            if not out and self.regression_weight + self.classification_weight <= 0:
                out.append("drafter.regression_weight, classification_weight: at least one must be > 0")
            return out

    def __init__(self, cfg: "Eagle1Drafter.Config", layer_config, embed_tokens: nn.Embedding, lm_head: nn.Module):
        super().__init__()
        h = layer_config.hidden_size
        self.cfg = cfg
        self.layer_config = layer_config
        self.fc = nn.Linear(2 * h, h, bias=cfg.fc_bias)
        self.layers = nn.ModuleList([DraftDecoderLayer(layer_config, input_size=h)])
        self.rotary = rotary(layer_config)
        self.embed_tokens = Frozen(embed_tokens)  # the target's frozen modules: not parameters, not in state_dict
        self.lm_head = Frozen(lm_head)

    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "Eagle1Drafter":
        layer_cfg = draft_layer_config(target.config, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
        return cls(cfg, layer_cfg, target.embed_tokens, target.lm_head).to(device=target.device)

    # ------------------------------------------------------------------ one step
    def step(self, token_ids, features, positions, cache: KVCache | None = None, documents=None) -> torch.Tensor:
        """[b, n] tokens x_{j+1}, [b, n, h] features f_j, [b, n] positions -> [b, n, h] predicted f_{j+1}.
        documents: [b, s] document ids of a packed batch (attention stays inside a document)."""
        dtype = self.fc.weight.dtype
        emb = self.embed_tokens[0](token_ids).to(dtype)  # [b, n] -> [b, n, h]
        x = self.fc(torch.cat([emb, features.to(dtype)], dim=-1))  # [b, n, 2h] -> [b, n, h]
        cos, sin = self.rotary(x, positions)
        return self.layers[0](x, x, cos, sin, cache=cache, step_kv=None if cache is not None else [], documents=documents)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        head = self.lm_head[0]
        return head(features.to(head.weight.dtype))  # [b, n, h] -> [b, n, V]

    # ------------------------------------------------------------------ training
    def forward_loss(self, batch) -> StepOutput:
        """EAGLE-1 training (Li et al. 2024, sec. 4.3), numbered:

        1. inputs: features f_j (plus uniform noise in training mode) and tokens x_{j+1}, j = 0..s-2;
        2. one causal pass predicts f_{j+1} at every position j (teacher forcing on true features);
        3. regression: smooth L1(f̂_{j+1}, f_{j+1}), mean over the hidden size;
        4. classification: forward KL(p_{j+1} || softmax(lm_head(f̂_{j+1}))), p the target's distribution
           (the paper's cross-entropy to p, less p's constant entropy);
        5. both summed over positions whose predicted token x_{j+2} is in the loss mask, combined with
           regression_weight / classification_weight; the sum is normalised by the caller.
        """
        ids = batch["input_ids"]
        b, s = ids.shape
        n = s - 1
        mask = (batch["loss_mask"] * batch["attention_mask"]).float()
        mask = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)[:, 2 : 2 + n]  # [b, s] -> [b, n]: x_{j+2} in the mask
        mask = mask * packing.valid_labels(batch, 2, n)  # packed rows: x_{j+2} in j's document
        feats = batch["last_hidden_state"].float()
        inputs = feats[:, :n]
        if self.training and self.cfg.noise_range > 0:  # 1.
            inputs = inputs + (torch.rand_like(inputs) - 0.5) * self.cfg.noise_range
        pred = self.step(ids[:, 1 : 1 + n], inputs, packing.positions(batch, n), documents=packing.document_ids_of(batch))  # 2. [b, n, h]
        reg = nn.functional.smooth_l1_loss(pred.float(), feats[:, 1 : 1 + n], reduction="none").mean(-1)  # 3. [b, n]
        logq = torch.log_softmax(self.logits(pred).float(), -1)  # [b, n, V]
        logp = torch.log_softmax(batch["target_logits"][:, 1 : 1 + n].float(), -1)
        kl = (logp.exp() * (logp - logq)).sum(-1)  # 4. [b, n]
        c = self.cfg
        total = c.regression_weight * (reg * mask).sum() + c.classification_weight * (kl * mask).sum()  # 5.
        with torch.no_grad():
            denom = mask.sum().clamp_min(1.0)
            hit = (logq.argmax(-1) == logp.argmax(-1)).float()
            metrics = {"acc_0": float((hit * mask).sum() / denom), "loss_reg": float((reg * mask).sum() / denom),
                       "loss_cls": float((kl * mask).sum() / denom)}
        return StepOutput(loss=total, metrics=metrics, num_tokens=int(mask.sum()))

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> "Eagle1Proposer":
        return Eagle1Proposer(self)


class Eagle1Proposer(FeatureChainProposer):
    """Chain / tree drafting with the drafter's own KV cache (heads/proposing.py); a committed token reads
    the target's post-norm last hidden state f_j, a draft step feeds back the predicted feature."""

    name = "eagle1"

    def features(self, target_out) -> torch.Tensor:
        return target_out.hidden_states[-1]  # [1, m, h] post-norm features f_j
