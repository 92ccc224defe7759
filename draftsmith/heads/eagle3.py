"""EAGLE-3 drafter (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test").

Architecture (tensor names follow SGLang's LlamaForCausalLMEagle3 so export is a rename-free copy):
  fc                 [3h -> h]   fuses the target's low/mid/high hidden states
  midlayer           one decoder layer whose attention reads [norm(embed(x)) ; norm(hidden)] (2h),
                     residual = hidden; its pre-norm output is the next step's hidden
  norm, lm_head      final RMSNorm, projection onto the draft vocabulary [h -> dv]
  embed_tokens       the target's frozen embedding (shared, never trained, not in checkpoints)
  d2t, t2d           draft vocabulary: target_id = draft_id + d2t[draft_id]; t2d marks kept target ids

Features read: aux_hidden_states = hidden_states[i] for i in aux_layer_ids (the input of target
layer i); target_logits (the soft labels). The last hidden state is not used.

Pairing (training and inference alike): drafter position j takes (target hidden h_j, token x_{j+1})
and predicts x_{j+2}; its label is the target's distribution at position j+1.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.data import packing
from draftsmith.eval.sampling import logits_to_probs, sample
from draftsmith.heads import DRAFTERS
from draftsmith.heads.base import Draft, Drafter, StepOutput
from draftsmith.heads.draft_layer import DraftDecoderLayer, KVCache, draft_layer_config, rotary
from draftsmith.target import default_aux_layer_ids


@DRAFTERS.register("eagle3")
class Eagle3Drafter(Drafter):
    kind = "eagle3"
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"})

    @dataclass
    class Config:
        # Target layer ids fused by fc (hidden_states[i] = input of layer i); None: low/mid/high
        # by target.default_aux_layer_ids ([2, L//2, L-3], made distinct for shallow targets).
        aux_layer_ids: Optional[list[int]] = None
        # Draft vocabulary size (most frequent training-target tokens); None: full vocabulary.
        draft_vocab_size: Optional[int] = None
        # Training-time-test unroll length: how many chained draft steps are trained.
        ttt_steps: int = 7
        # Loss weight of unroll step t is step_decay ** t (later steps matter less).
        step_decay: float = 0.8
        # Draft layer shape; None copies the target's.
        num_heads: Optional[int] = None
        num_kv_heads: Optional[int] = None
        intermediate_size: Optional[int] = None
        # Initialise lm_head from the target's lm_head rows of the draft vocabulary (faster start).
        init_lm_head_from_target: bool = True

    def __init__(self, cfg: "Eagle3Drafter.Config", layer_config, aux_layer_ids: list[int], draft_vocab_size: int,
                 target_vocab_size: int, embed_tokens: nn.Embedding):
        super().__init__()
        h = layer_config.hidden_size
        self.cfg = cfg
        self.layer_config = layer_config
        self.aux_layer_ids = list(aux_layer_ids)
        self.fc = nn.Linear(len(aux_layer_ids) * h, h, bias=False)
        self.midlayer = DraftDecoderLayer(layer_config, input_size=2 * h)
        self.midlayer.input_layernorm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.midlayer.hidden_norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.rotary = rotary(layer_config)
        self.embed_tokens = [embed_tokens]  # a list hides the shared frozen module from parameters()/state_dict()
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(target_vocab_size, dtype=torch.bool))

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "Eagle3Drafter":
        from draftsmith.data import draft_vocab

        aux = cls.feature_layers_for(cfg, target)
        bad = [i for i in aux if not 0 <= i < target.num_layers]
        if bad:
            raise ValueError(f"drafter.aux_layer_ids {aux}: ids must lie in 0..{target.num_layers - 1} for this target")
        layer_cfg = draft_layer_config(target.config, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size)
        V = target.vocab_size
        dv = cfg.draft_vocab_size or V
        if dv > V:
            raise ValueError(f"drafter.draft_vocab_size {dv} exceeds the target vocabulary ({V})")
        counts = token_counts if token_counts is not None else torch.zeros(V, dtype=torch.long)
        d2t, t2d = draft_vocab.build(counts, dv)
        drafter = cls(cfg, layer_cfg, aux, dv, V, target.embed_tokens)
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)
        if cfg.init_lm_head_from_target:
            with torch.no_grad():
                drafter.lm_head.weight.copy_(target.lm_head.weight[drafter.draft_ids()].float())
        return drafter.to(device=target.device)

    @classmethod
    def feature_layers_for(cls, cfg, target) -> list[int]:
        return list(cfg.aux_layer_ids or default_aux_layer_ids(target.num_layers))

    def draft_ids(self) -> torch.Tensor:
        """[dv] target ids of the draft vocabulary."""
        return torch.arange(len(self.d2t), device=self.d2t.device) + self.d2t

    # ------------------------------------------------------------------ one step
    def step(self, token_ids, hidden, positions, cache: KVCache | None = None, step_kv=None, documents=None):
        """[b, n] tokens, [b, n, h] hidden, [b, n] positions -> [b, n, h] pre-norm output.
        documents: [b, s] document ids of a packed batch (TTT attention stays inside a document)."""
        emb = self.embed_tokens[0](token_ids).to(hidden.dtype)  # [b, n] -> [b, n, h]
        layer = self.midlayer
        attn_input = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)  # -> [b, n, 2h]
        cos, sin = self.rotary(hidden, positions)
        return layer(attn_input, hidden, cos, sin, cache=cache, step_kv=step_kv, documents=documents)

    def logits(self, out: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(out))  # [b, n, h] -> [b, n, dv]

    # ------------------------------------------------------------------ training
    def forward_loss(self, batch) -> StepOutput:
        """EAGLE-3 training-time test, numbered as in the paper's training recipe:

        1. fuse the aux hidden states: [b, s, 3h] -> [b, s, h];
        2. soft labels: the target's next-token distribution restricted to the draft vocabulary;
        3. unroll t = 0..ttt_steps-1: position j reads (hidden_j, x_{j+1+t}) and predicts x_{j+2+t};
           step t's hidden is step t-1's output (the drafter's own feature, as at inference);
        4. loss_t = forward KL(p || q) summed over positions whose predicted token is in the loss mask,
           weighted by step_decay ** t; the sum is normalised by the caller (see StepOutput).
        """
        ids = batch["input_ids"]
        b, s = ids.shape
        mask = (batch["loss_mask"] * batch["attention_mask"]).float()
        mask = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)  # [b, s] -> [b, s+1]: no label past the end
        hidden = self.fc(batch["aux_hidden_states"].to(self.fc.weight.dtype))  # 1. [b, s, 3h] -> [b, s, h]
        target_logits = batch["target_logits"].float()
        draft_ids = self.draft_ids()  # [dv] target ids of the draft vocabulary
        p = torch.softmax(target_logits[..., draft_ids], dim=-1)  # 2. [b, s, V] -> [b, s, dv]
        target_top = target_logits.argmax(-1)  # [b, s] target ids
        step_kv: list = []
        total = hidden.new_zeros((), dtype=torch.float32)
        metrics: dict[str, float] = {}
        num_tokens = int((mask[:, 2:] * packing.valid_labels(batch, 2, s - 1)).sum())  # packed: labels in j's document
        for t in range(self.cfg.ttt_steps):  # 3.
            n = s - 1 - t
            if n <= 0:
                break
            positions = packing.positions(batch, n) + t  # [b, n]
            hidden = self.step(ids[:, 1 + t : 1 + t + n], hidden[:, :n], positions, step_kv=step_kv,
                               documents=packing.document_ids_of(batch))
            logq = torch.log_softmax(self.logits(hidden).float(), dim=-1)  # [b, n, dv]
            p_t = p[:, 1 + t : 1 + t + n]
            m = mask[:, 2 + t : 2 + t + n] * packing.valid_labels(batch, 2 + t, n)
            kl = (p_t * (torch.log(p_t.clamp_min(1e-20)) - logq)).sum(-1)  # 4. [b, n]
            total = total + (self.cfg.step_decay**t) * (kl * m).sum()
            with torch.no_grad():
                hit = (draft_ids[logq.argmax(-1)] == target_top[:, 1 + t : 1 + t + n]).float()
                denom = m.sum().clamp_min(1.0)
                metrics[f"acc_{t}"] = float((hit * m).sum() / denom)
                metrics[f"loss_{t}"] = float((kl * m).sum() / denom)
        return StepOutput(loss=total, metrics=metrics, num_tokens=num_tokens)

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> "Eagle3Proposer":
        return Eagle3Proposer(self, target)


class Eagle3Proposer:
    """Chain drafting with the drafter's own KV cache; rolls back to the committed context on commit."""

    name = "eagle3"

    def __init__(self, drafter: Eagle3Drafter, target):
        self.drafter = drafter
        self.vocab_size = target.vocab_size
        self.draft_ids = drafter.draft_ids()

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.cache = KVCache()
        self.committed = 0  # cache entries that belong to committed context
        self.last_out: torch.Tensor | None = None  # [1, 1, h] output of the newest committed pair

    @torch.no_grad()
    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        d = self.drafter
        self.cache.crop(self.committed)  # drop the speculative chain of the last round
        aux = torch.cat([target_out.hidden_states[i] for i in d.aux_layer_ids], dim=-1)  # [1, m, 3h]
        hidden = d.fc(aux.to(d.fc.weight.dtype))  # [1, m, 3h] -> [1, m, h]
        tokens = context[-num_new:].view(1, -1).to(hidden.device)
        positions = torch.arange(self.committed, self.committed + num_new, device=hidden.device).view(1, -1)
        out = d.step(tokens, hidden, positions, cache=self.cache)
        self.committed += num_new
        self.last_out = out[:, -1:]

    def _target_probs(self, draft_logits: torch.Tensor, sampling) -> torch.Tensor:
        """[dv] draft logits -> [V] probabilities over the target vocabulary (same transform as p)."""
        full = draft_logits.new_full((self.vocab_size,), float("-inf"), dtype=torch.float32)
        full[self.draft_ids] = draft_logits.float()
        return logits_to_probs(full, sampling)

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        d = self.drafter
        out = self.last_out
        tokens, probs = [], []
        for i in range(k):
            q = self._target_probs(d.logits(out)[0, -1], sampling)
            token = sample(q, generator) if not sampling.greedy else q.argmax()
            tokens.append(token)
            probs.append(q)
            if i + 1 < k:
                pos = torch.tensor([[self.committed + i]], device=out.device)
                out = d.step(token.view(1, 1), out, pos, cache=self.cache)
        return Draft(tokens=torch.stack(tokens).view(-1), probs=torch.stack(probs))

