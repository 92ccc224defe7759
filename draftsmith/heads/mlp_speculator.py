"""MLP speculator (Wertheimer et al. 2024, "Accelerating Production LLMs with Combined
Token/Embedding Speculators", arXiv 2404.19124), the drafter vLLM serves as MLPSpeculator.

Architecture (tensor names and math follow vLLM's MLPSpeculator, so export is a rename-free copy):
  emb.{i}   Embedding [V -> d]         embedding of the token stage i conditions on
  proj.{i}  Linear [h or d -> d], no bias   projection of the previous state (stage 0: the target's)
  ln.{i}    RMS-style norm with weight and bias (vLLM's MLPSpeculatorLayerNorm)
  head.{i}  Linear [d -> V], no bias   stage i's vocabulary projection
  (d = inner_dim; ln0, the parameter-free input norm of scale_input, has no tensors)
Stage i: state <- GELU(ln_i(proj_i(state) + emb_i(token) * emb_weight / state_weight)), logits = head_i(state),
with state_weight = 0.5 ** (0.5 / n_predict) and emb_weight = sqrt((1 - state_weight^2) * d / 2).
tie_weights shares emb, head and ln across stages and proj across stages >= 1; each shared module is
stored once (keys emb.0, proj.0, proj.1, head.0, ln.0: the names vLLM's loader sees for a tied model).

Feature read: last_hidden_state = hidden_states[num_layers], AFTER the target's final norm (what
vLLM hands the speculator).

Pairing (training and inference alike): stage 0 at position j takes (h_j, x_{j+1}) and predicts
x_{j+2}; stage i takes (state_{i-1, j}, x_{j+1+i}) and predicts x_{j+2+i}. At inference x_{j+1} is the
newest committed token and later stages condition on the previous stage's draft token.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import nn

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import logits_to_probs
from draftsmith.data import packing
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, StepOutput, range_problems
from draftsmith.heads.proposing import LastStateProposer, draw


class SpeculatorNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps), then an optional elementwise weight and bias (vLLM's layer norm)."""

    def __init__(self, size: int, eps: float = 1e-6, affine: bool = True):
        super().__init__()
        self.eps = eps
        self.affine = affine
        if affine:
            self.weight = nn.Parameter(torch.ones(size))
            self.bias = nn.Parameter(torch.zeros(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return y * self.weight + self.bias if self.affine else y


@DRAFTERS.register("mlp_speculator")
class MLPSpeculatorDrafter(Drafter):
    kind = "mlp_speculator"
    tiny_options = {"n_predict": 2}
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "last_hidden_state", "target_logits"})

    @dataclass
    class Config:
        # Number of stages = most tokens proposed per round.
        n_predict: int = 3
        # Width of the stages' state; None: the target's hidden size.
        inner_dim: Optional[int] = None
        # Share emb/head/ln across stages and proj across stages >= 1 (fewer parameters).
        tie_weights: bool = False
        # Normalise the target state (parameter-free) and divide by sqrt(2) before stage 0.
        scale_input: bool = False
        # Labels: "target_greedy" = the target's argmax at that offset; "data" = the data token
        # (equal on answers the target regenerated itself).
        labels: Literal["target_greedy", "data"] = "target_greedy"
        # Loss weight of stage i is stage_decay ** i (the paper weighs stages equally: 1.0).
        stage_decay: float = 1.0

        def problems(self) -> list[str]:
            """Ranges `config.load` and `draftsmith validate` report (one message per bad option)."""
            out = range_problems(self, {"n_predict": ">= 1", "inner_dim": ">= 1", "stage_decay": "> 0"})
            if self.tie_weights and self.n_predict == 1:
                out.append("drafter.n_predict: must be >= 2 with drafter.tie_weights: true, got 1")
            return out

    def __init__(self, cfg: "MLPSpeculatorDrafter.Config", hidden_size: int, vocab_size: int):
        super().__init__()
        n, d = cfg.n_predict, cfg.inner_dim or hidden_size
        if n < 1 or (cfg.tie_weights and n < 2):
            raise UserError(f"drafter.n_predict={n}: needs >= 1 stage (>= 2 with drafter.tie_weights)")
        self.cfg, self.inner_dim = cfg, d
        stored = 1 if cfg.tie_weights else n
        self.emb = nn.ModuleList([nn.Embedding(vocab_size, d) for _ in range(stored)])
        self.proj = nn.ModuleList([nn.Linear(hidden_size if i == 0 else d, d, bias=False)
                                   for i in range(min(2, n) if cfg.tie_weights else n)])
        self.ln = nn.ModuleList([SpeculatorNorm(d) for _ in range(stored)])
        self.head = nn.ModuleList([nn.Linear(d, vocab_size, bias=False) for _ in range(stored)])
        self.ln0 = SpeculatorNorm(hidden_size, affine=False) if cfg.scale_input else None
        self.state_weight = 0.5 ** (0.5 / n)
        self.emb_weight = math.sqrt((1 - self.state_weight**2) * (d / 2))
        self.act = nn.GELU()
        for module in [*self.emb, *self.proj, *self.head]:  # the paper's init: N(0, 1/sqrt(d))
            nn.init.normal_(module.weight, std=1 / math.sqrt(d))

    def max_draft_tokens(self) -> int:
        return self.cfg.n_predict  # one token per stage

    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "MLPSpeculatorDrafter":
        return cls(cfg, target.hidden_size, target.vocab_size).to(device=target.device)

    def _module(self, modules: nn.ModuleList, i: int) -> nn.Module:
        return modules[min(i, len(modules) - 1)]  # tied: stage i reuses the one stored module

    def input_state(self, hidden: torch.Tensor) -> torch.Tensor:
        hidden = hidden.to(self.proj[0].weight.dtype)
        return self.ln0(hidden) / math.sqrt(2) if self.ln0 is not None else hidden

    def stage(self, i: int, state: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Stage i: [b, n, h or d] state, [b, n] tokens -> [b, n, d] next state."""
        z = self._module(self.emb, i)(token_ids)  # [b, n] -> [b, n, d]
        x = self._module(self.proj, i)(state) + z * (self.emb_weight / self.state_weight)  # -> [b, n, d]
        return self.act(self._module(self.ln, i)(x))

    def logits(self, i: int, state: torch.Tensor) -> torch.Tensor:
        return self._module(self.head, i)(state)  # [b, n, d] -> [b, n, V]

    def stage_logits(self, hidden: torch.Tensor, ids: torch.Tensor) -> list[torch.Tensor]:
        """Teacher-forced stages: entry i is [b, s-1-i, V], position j predicting x_{j+2+i}."""
        s, out = ids.shape[1], []
        state = self.input_state(hidden)
        for i in range(self.cfg.n_predict):
            n = s - 1 - i
            if n <= 0:
                break
            state = self.stage(i, state[:, :n], ids[:, 1 + i : 1 + i + n])
            out.append(self.logits(i, state))
        return out

    def forward_loss(self, batch) -> StepOutput:
        """MLP speculator training (Wertheimer et al. 2024, sec. 3), numbered:

        1. stage 0's state is the target's last hidden state h_j; stage i reads stage i-1's state
           and the embedding of the true token x_{j+1+i} (teacher forcing);
        2. stage i at position j predicts x_{j+2+i}; label = the target's greedy token argmax p_{j+1+i}
           (or the data token x_{j+2+i});
        3. hard CE summed over positions whose predicted token is in the loss mask, stage i weighted
           by stage_decay ** i; the sum is normalised by the caller (num_tokens = stage 0's count).
        """
        ids = batch["input_ids"]
        mask = (batch["loss_mask"] * batch["attention_mask"]).float()
        greedy = batch["target_logits"].argmax(-1) if self.cfg.labels == "target_greedy" else None  # [b, s]
        total = torch.zeros((), device=ids.device)
        metrics: dict[str, float] = {}
        weights: dict[str, float] = {}
        for i, logits in enumerate(self.stage_logits(batch["last_hidden_state"], ids)):  # 1.
            n = logits.shape[1] - 1  # the last position's label lies past the end
            if n <= 0:
                break
            labels = ids[:, 2 + i : 2 + i + n] if greedy is None else greedy[:, 1 + i : 1 + i + n]  # 2.
            m = mask[:, 2 + i : 2 + i + n] * packing.valid_labels(batch, 2 + i, n)  # packed: label in j's document
            logq = torch.log_softmax(logits[:, :n].float(), -1)  # [b, n, V]
            per = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [b, n]
            total = total + (self.cfg.stage_decay**i) * (per * m).sum()  # 3.
            with torch.no_grad():
                denom = m.sum().clamp_min(1.0)
                metrics[f"acc_{i}"] = float(((logq.argmax(-1) == labels).float() * m).sum() / denom)
                metrics[f"loss_{i}"] = float((per * m).sum() / denom)
                weights[f"acc_{i}"] = weights[f"loss_{i}"] = float(m.sum())  # pooled by tokens
        s = ids.shape[1]
        return StepOutput(loss=total, metrics=metrics, weights=weights,
                          num_tokens=int((mask[:, 2:] * packing.valid_labels(batch, 2, s - 2)).sum()))

    def make_proposer(self, target) -> "MLPSpeculatorProposer":
        return MLPSpeculatorProposer(self)


class MLPSpeculatorProposer(LastStateProposer):
    """Stage i proposes draft token i+1 from (state, previous token); no KV cache.

    commit() keeps h, the target state whose next token is the newest committed token c
    (heads/proposing.py); stage 0 reads (h, c), stage i >= 1 reads (stage i-1's state, draft token i).
    """

    name = "mlp_speculator"

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        d = self.drafter
        if k > d.cfg.n_predict:
            raise UserError(f"the MLP speculator has {d.cfg.n_predict} stages: k={k} is too many; lower k "
                             f"(eval --k) to <= {d.cfg.n_predict} or train more stages (drafter.n_predict)")
        state = d.input_state(self.state("propose"))
        token = context[-1:].view(1, 1).to(state.device)
        tokens, probs = [], []
        for i in range(k):
            state = d.stage(i, state, token)  # [1, 1, h or d] -> [1, 1, d]
            q = logits_to_probs(d.logits(i, state)[0, -1], sampling)  # [V]
            nxt = draw(q, sampling, generator)
            tokens.append(nxt)
            probs.append(q)
            token = nxt.view(1, 1)
        return Draft(tokens=torch.stack(tokens).view(-1), probs=torch.stack(probs))

    # ------------------------------------------------------------------ tree drafting (eval/tree.py)
    @property
    def max_tree_depth(self) -> int:
        return self.drafter.cfg.n_predict

    @torch.no_grad()
    def tree_root(self) -> torch.Tensor:
        d = self.drafter
        state = d.input_state(self.state("tree_root"))
        self.tree_root_state = d.stage(0, state, self._last_token.view(1, 1).to(state.device))  # [1, 1, d]
        self.tree_states = self.tree_root_state[:, :0]  # [1, F, d] per fed node
        return torch.log_softmax(d.logits(0, self.tree_root_state)[0, -1].float(), -1)  # [V]

    @torch.no_grad()
    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        """Stage `depth` reads (the parent's state, the node's token) for m nodes at once -> [m, V]."""
        d = self.drafter
        bank = torch.cat([self.tree_root_state, self.tree_states], dim=1)  # [1, 1 + F, d]
        state = d.stage(depth, bank[:, parents.to(bank.device) + 1], tokens.view(1, -1).to(bank.device))  # [1, m, d]
        self.tree_states = torch.cat([self.tree_states, state], dim=1)
        return torch.log_softmax(d.logits(depth, state)[0].float(), -1)  # [m, V]
