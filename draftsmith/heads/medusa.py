"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads").

Architecture (tensor names follow vLLM's Medusa loader, so export is a rename-free copy):
  blocks.{i}.layers.{j}   head i's residual block j: x <- x + SiLU(Linear(x)) (weight and bias
                          zero-initialised, so an untrained head equals its vocabulary projection)
  lm_heads.{i}            head i's vocabulary projection [h -> V], initialised from the target's lm_head

Feature read: last_hidden_state = hidden_states[num_layers], AFTER the target's final norm (the
lm_head input). Every head reads the SAME state.

Indexing (the paper's sec. 2.1.1: "the k-th head predicts the token at position t+k+1; the original
lm_head predicts t+1"): the target state h_j at position j predicts x_{j+1} through the target's own
lm_head; head i (0-based) on h_j predicts x_{j+2+i}. At inference h is the state whose next token is
the newest committed token c, so head i proposes the (i+1)-th token after c: draft token i+1.

Medusa-2 (`lora: true`, paper sec. 2.2.2): the heads are trained jointly with a LoRA adapter on the
target (peft). The drafter owns a *view* of the target: a structural copy whose frozen weight
tensors are the target's own (no memory is duplicated), wrapped by peft; the target the loop and the
eval use stays untouched. The heads then read the adapted model's last hidden state (computed inside
forward_loss, with gradients into the adapter) and a KL term keeps the adapted model's next-token
distribution close to the frozen target's (self-distillation, paper sec. 2.3.2). `save_adapter(dir)`
writes a standard peft adapter. Caveat: Medusa-2 heads are meant to run on the ADAPTED model's
hidden states; draftsmith's eval loop verifies with the frozen target, so evaluate a Medusa-2 drafter
with the adapter merged into the verifier (its outputs then follow the adapted model, as in the paper).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Literal, Optional

import torch
from torch import nn

from draftsmith import packing
from draftsmith.heads import DRAFTERS
from draftsmith.heads.base import Draft, Drafter, StepOutput, range_problems
from draftsmith.sampling import logits_to_probs, sample


class ResidualBlock(nn.Module):
    """num_layers x (x <- x + SiLU(Linear(x))); key names blocks.{i}.layers.{j}.weight/.bias."""

    def __init__(self, hidden_size: int, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(hidden_size, hidden_size, bias=True) for _ in range(num_layers)])
        self.act = nn.SiLU()
        for layer in self.layers:
            nn.init.zeros_(layer.weight)
            nn.init.zeros_(layer.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = x + self.act(layer(x))  # [..., h] -> [..., h]
        return x


def shared_weight_copy(model: nn.Module) -> nn.Module:
    """A structural copy of `model` whose parameters and buffers ARE the original tensors
    (deepcopy with every tensor pre-seeded in the memo): new module objects, no new weights."""
    memo = {id(t): t for t in [*model.parameters(), *model.buffers()]}
    return copy.deepcopy(model, memo)


@DRAFTERS.register("medusa")
class MedusaDrafter(Drafter):
    kind = "medusa"
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "last_hidden_state", "target_logits"})

    @dataclass
    class Config:
        # Number of heads; head i predicts the token i+2 positions after the state's own position.
        num_heads: int = 4
        # Residual blocks per head (vLLM's num_hidden_layers of a Medusa config).
        num_layers: int = 1
        # Labels: "ce" = hard CE on the target's greedy token at that offset; "kl" = forward KL to the
        # target's distribution there; "ce_data" = hard CE on the data token (Medusa-1 on raw data).
        loss: Literal["ce", "kl", "ce_data"] = "ce"
        # Weight of head i is head_decay ** i (the Medusa repo uses 0.8), unless head_weights is given.
        head_decay: float = 0.8
        head_weights: Optional[list[float]] = None
        # Initialise every head's vocabulary projection from the target's lm_head.
        init_lm_head_from_target: bool = True
        # Medusa-2: train a LoRA adapter on the target jointly with the heads (needs peft).
        lora: bool = False
        lora_r: int = 8
        lora_alpha: int = 16
        lora_dropout: float = 0.0
        lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
        # Weight of KL(frozen target || adapted target) on next-token distributions (keeps the backbone's quality).
        lora_kl_weight: float = 1.0

        def problems(self) -> list[str]:
            """Ranges `config.load` and `draftsmith validate` report (one message per bad option)."""
            out = range_problems(self, {"num_heads": ">= 1", "num_layers": ">= 0", "head_decay": "> 0",
                                        "head_weights": ">= 0", "lora_r": ">= 1", "lora_alpha": ">= 1",
                                        "lora_dropout": ">= 0 and < 1", "lora_kl_weight": ">= 0"})
            if self.head_weights is not None and len(self.head_weights) != self.num_heads:
                out.append(f"drafter.head_weights: has {len(self.head_weights)} entries; give one per head "
                           f"(drafter.num_heads = {self.num_heads})")
            return out

    def __init__(self, cfg: "MedusaDrafter.Config", hidden_size: int, vocab_size: int):
        super().__init__()
        if cfg.num_heads < 1 or cfg.num_layers < 0:
            raise ValueError(f"drafter.num_heads ({cfg.num_heads}) must be >= 1 and drafter.num_layers "
                             f"({cfg.num_layers}) >= 0")
        if cfg.head_weights is not None and len(cfg.head_weights) != cfg.num_heads:
            raise ValueError(f"drafter.head_weights has {len(cfg.head_weights)} entries; give one per head "
                             f"(drafter.num_heads = {cfg.num_heads})")
        self.cfg = cfg
        self.blocks = nn.ModuleList([ResidualBlock(hidden_size, cfg.num_layers) for _ in range(cfg.num_heads)])
        self.lm_heads = nn.ModuleList([nn.Linear(hidden_size, vocab_size, bias=False) for _ in range(cfg.num_heads)])
        self.adapted: list = []  # Medusa-2: [peft model] (a list hides the target view from state_dict)
        if cfg.lora:
            self.required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "target_logits"})

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "MedusaDrafter":
        drafter = cls(cfg, target.hidden_size, target.vocab_size)
        if cfg.init_lm_head_from_target:
            with torch.no_grad():
                for head in drafter.lm_heads:
                    head.weight.copy_(target.lm_head.weight.float())
        drafter = drafter.to(device=target.device)
        if cfg.lora:
            drafter.attach_lora(target)
        return drafter

    def attach_lora(self, target) -> None:
        """Medusa-2: wrap a shared-weight view of the target with a fresh peft LoRA adapter and
        register the adapter's parameters as this drafter's (state_dict keys `lora.<name>`)."""
        from peft import LoraConfig, get_peft_model

        c = self.cfg
        lora_cfg = LoraConfig(r=c.lora_r, lora_alpha=c.lora_alpha, lora_dropout=c.lora_dropout,
                              target_modules=list(c.lora_target_modules), bias="none", task_type="CAUSAL_LM")
        model = get_peft_model(shared_weight_copy(target.model), lora_cfg)
        model.eval()  # the backbone has no dropout to train; LoRA dropout follows this flag
        trainable = {name.replace(".", "__"): p for name, p in model.named_parameters() if p.requires_grad}
        if not trainable:
            raise ValueError(f"drafter.lora_target_modules {c.lora_target_modules} matched no module of the target")
        self.lora = nn.ParameterDict(trainable)
        self.adapted = [model]

    def save_adapter(self, path) -> None:
        """Write the Medusa-2 LoRA adapter as a standard peft adapter directory."""
        if not self.adapted:
            raise ValueError("save_adapter: this Medusa drafter has no LoRA adapter (set drafter.lora=true)")
        self.adapted[0].save_pretrained(str(path))

    def head_weights(self) -> list[float]:
        return list(self.cfg.head_weights or [self.cfg.head_decay**i for i in range(self.cfg.num_heads)])

    def head_logits(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """[b, n, h] states -> num_heads x [b, n, V]; entry i predicts the token i+2 positions on."""
        hidden = hidden.to(self.lm_heads[0].weight.dtype)
        return [head(block(hidden)) for block, head in zip(self.blocks, self.lm_heads)]

    # ------------------------------------------------------------------ training
    def _features(self, batch) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (last hidden state the heads read, KL term sum). Medusa-1: the frozen target's
        state and 0; Medusa-2: one adapted-target forward (with grad into the adapter) and
        KL(p_frozen || p_adapted) summed over positions whose next token is a loss token."""
        if not self.adapted:
            return batch["last_hidden_state"], torch.zeros((), device=batch["input_ids"].device)
        inputs = packing.model_inputs(batch, self.adapted[0].dtype)  # packed rows: block-diagonal mask
        out = self.adapted[0](input_ids=batch["input_ids"], output_hidden_states=True, **inputs)
        m = (batch["loss_mask"] * batch["attention_mask"]).float()[:, 1:]  # position j predicts x_{j+1}
        m = m * packing.valid_labels(batch, 1, m.shape[1])
        logp = torch.log_softmax(batch["target_logits"][:, :-1].float(), -1)  # [b, s-1, V]
        logq = torch.log_softmax(out.logits[:, :-1].float(), -1)
        kl = (logp.exp() * (logp - logq)).sum(-1)  # [b, s-1]
        return out.hidden_states[-1], (kl * m).sum()

    def forward_loss(self, batch) -> StepOutput:
        """Medusa training (Cai et al. 2024, sec. 2.2), numbered:

        1. the state every head reads: h_j (the target's, or the adapted target's for Medusa-2);
        2. head i at position j predicts x_{j+2+i}; its label is the target's greedy token
           argmax p_{j+1+i} ("ce"), the distribution p_{j+1+i} ("kl"), or the data token ("ce_data");
        3. loss_i summed over positions whose predicted token is in the loss mask, weighted by
           head_weights[i]; plus lora_kl_weight * KL(frozen || adapted) for Medusa-2. The sum is
           normalised by the caller over num_tokens (head 0's count, as EAGLE-3's step 0).
        """
        ids = batch["input_ids"]
        b, s = ids.shape
        mask = (batch["loss_mask"] * batch["attention_mask"]).float()
        hidden, kl_lm = self._features(batch)  # 1.
        target_logits = batch["target_logits"].float()
        total = self.cfg.lora_kl_weight * kl_lm if self.adapted else kl_lm.new_zeros(())
        metrics: dict[str, float] = {"loss_lora_kl": float(kl_lm.detach())} if self.adapted else {}
        weights: dict[str, float] = {}
        for i, (logits, w) in enumerate(zip(self.head_logits(hidden), self.head_weights())):  # 2.
            n = s - 2 - i
            if n <= 0:
                break
            logq = torch.log_softmax(logits[:, :n].float(), -1)  # [b, n, V]
            p_logits = target_logits[:, 1 + i : 1 + i + n]
            m = mask[:, 2 + i : 2 + i + n] * packing.valid_labels(batch, 2 + i, n)  # packed: label in j's document
            labels = ids[:, 2 + i : 2 + i + n] if self.cfg.loss == "ce_data" else p_logits.argmax(-1)
            if self.cfg.loss == "kl":
                logp = torch.log_softmax(p_logits, -1)
                per = (logp.exp() * (logp - logq)).sum(-1)  # [b, n]
            else:
                per = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [b, n]
            total = total + w * (per * m).sum()  # 3.
            with torch.no_grad():
                denom = m.sum().clamp_min(1.0)
                metrics[f"acc_{i}"] = float(((logq.argmax(-1) == labels).float() * m).sum() / denom)
                metrics[f"loss_{i}"] = float((per * m).sum() / denom)
                weights[f"acc_{i}"] = weights[f"loss_{i}"] = float(m.sum())  # pooled by tokens
        return StepOutput(loss=total, metrics=metrics, weights=weights,
                          num_tokens=int((mask[:, 2:] * packing.valid_labels(batch, 2, s - 2)).sum()))

    # ------------------------------------------------------------------ export and inference
    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        """vLLM's Medusa weights: blocks.{i}.layers.{j}.weight/.bias and lm_heads.{i}.weight only
        (a Medusa-2 adapter is exported separately with save_adapter)."""
        return {k: v for k, v in self.state_dict().items() if k.startswith(("blocks.", "lm_heads."))}

    def make_proposer(self, target) -> "MedusaProposer":
        return MedusaProposer(self)


class MedusaProposer:
    """Chain proposals from the heads on one state (no KV cache, no draft recurrence).

    commit() keeps h, the target state whose next token is the newest committed token c;
    propose(k) returns head i's token for i < k, i.e. the (i+1)-th token after c.
    """

    name = "medusa"

    def __init__(self, drafter: MedusaDrafter):
        self.drafter = drafter
        self.last_hidden: torch.Tensor | None = None

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.last_hidden = None

    @torch.no_grad()
    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        self.last_hidden = target_out.hidden_states[-1][:, -1:]  # [1, m, h] -> [1, 1, h]

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        n = self.drafter.cfg.num_heads
        if k > n:
            raise ValueError(f"Medusa proposes at most one token per head: k={k} > num_heads={n}; "
                             f"lower k (eval --k) to <= {n} or train more heads (drafter.num_heads)")
        if self.last_hidden is None:
            raise RuntimeError("MedusaProposer.propose before commit(): the loop must commit the prefill first")
        tokens, probs = [], []
        for block, head in list(zip(self.drafter.blocks, self.drafter.lm_heads))[:k]:
            x = self.last_hidden.to(head.weight.dtype)
            q = logits_to_probs(head(block(x))[0, -1], sampling)  # [1, 1, h] -> [V]
            tokens.append(q.argmax() if sampling.greedy else sample(q, generator))
            probs.append(q)
        return Draft(tokens=torch.stack(tokens).view(-1), probs=torch.stack(probs))

    # ------------------------------------------------------------------ tree drafting (eval/tree.py)
    @property
    def max_tree_depth(self) -> int:
        return self.drafter.cfg.num_heads

    def _head_logprobs(self, i: int) -> torch.Tensor:
        block, head = self.drafter.blocks[i], self.drafter.lm_heads[i]
        return torch.log_softmax(head(block(self.last_hidden.to(head.weight.dtype)))[0, -1].float(), -1)  # [V]

    @torch.no_grad()
    def tree_root(self) -> torch.Tensor:
        if self.last_hidden is None:
            raise RuntimeError("MedusaProposer.tree_root before commit(): the loop must commit the prefill first")
        return self._head_logprobs(0)

    @torch.no_grad()
    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        """Medusa heads read one state: the children of every node at `depth` come from head `depth`."""
        return self._head_logprobs(depth).expand(tokens.shape[0], -1)  # [m, V]
