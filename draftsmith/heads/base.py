"""The Drafter interface every drafter kind implements, and the Proposer protocol the
speculative loop (eval/loop.py) drives.

Batch features (dict keys a drafter lists in `required_features`):
  input_ids          [b, s]      long, the token ids
  attention_mask     [b, s]      1 on real tokens, 0 on padding
  loss_mask          [b, s]      1 where token j is an assistant token to be predicted
  aux_hidden_states  [b, s, n*h] hidden_states[i] for i in drafter.feature_layers(), concatenated
  last_hidden_state  [b, s, h]   hidden_states[num_layers] (after the final norm: the lm_head input)
  target_logits      [b, s, V]   the target's next-token logits at each position (with features.label_topk,
                                 a data.features.TopKLogits of the top-K: only for takes_topk_labels kinds)
Position j of every feature is computed from tokens <= j, so it predicts token j+1.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Protocol

import torch
from torch import nn

from draftsmith.core.registry import Registry

# Every drafter kind, registered under its recipe name (`@DRAFTERS.register("eagle3")`); heads/__init__.py
# imports each kind's module so that the registry is full once draftsmith.heads is imported.
DRAFTERS: Registry = Registry("drafter kind")


@dataclass
class StepOutput:
    # Scalar, differentiable: the SUM of the per-token loss over this micro-batch's loss tokens;
    # the training loop divides by the global token count (all micro-batches, all ranks).
    loss: torch.Tensor
    # For logging: per-position (TTT step / head) accuracy under "acc_{i}". Floats, or detached 0-d
    # tensors left on the device (the loop reads those once per log step: no per-step host sync).
    metrics: dict[str, float] = field(default_factory=dict)
    # Number of loss tokens in this micro-batch (for global normalisation across ranks).
    num_tokens: int = 0
    # Tokens each metric is averaged over (e.g. position i's loss tokens for acc_i); the loop pools
    # metrics over micro-batches and ranks weighted by these. A metric not listed weighs num_tokens.
    weights: dict[str, float] = field(default_factory=dict)


@dataclass
class Draft:
    tokens: torch.Tensor  # [k] target-vocabulary ids
    # [k, V_target]: the draft distribution q each token was drawn from, AFTER the same
    # temperature/top-k/top-p transform as the target's p; None for deterministic proposers
    # (n-gram lookup), whose q is one-hot on the proposed token.
    probs: Optional[torch.Tensor] = None


class Proposer(Protocol):
    """What the speculative loop calls; one instance serves one request at a time.

    Rounds: begin(prompt) once; then commit() after the prefill and after every verification
    pass, propose() before every verification pass. A proposer that keeps a KV cache rolls
    it back inside commit() to the committed context (speculative positions are discarded).
    """

    name: str

    def begin(self, prompt_ids: torch.Tensor) -> None:
        """Reset per-request state. prompt_ids: [n]."""

    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        """context: [N] all committed ids, the newest num_new of them just committed.
        target_out: TargetOutput over exactly num_new positions, position j being the target
        state whose next token is context[N - num_new + j] (after the prefill, num_new is the
        prompt length minus 1 plus the first generated token, i.e. len(prompt)).
        A commit reads target_out.hidden_states only: its logits may be None (NgramFirstProposer merges
        the states of several deferred rounds into one commit and keeps no logits)."""

    def propose(self, context: torch.Tensor, k: int, sampling, generator: torch.Generator | None) -> Draft:
        """Propose k tokens following context. `sampling` is draftsmith.core.sampling.SamplingParams."""


_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


def range_problems(cfg: Any, rules: dict[str, str], where: str = "drafter") -> list[str]:
    """Range checks of a drafter Config, one message per bad option, for `config.load` / `validate`.

    rules: option -> "OP NUMBER" conditions joined by " and ", e.g. {"ttt_steps": ">= 1",
    "lora_dropout": ">= 0 and < 1"}. None values (an optional option left unset) pass; list
    values are checked item by item.
    """
    problems = []
    for name, rule in rules.items():
        value = getattr(cfg, name)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if v is None or not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            ok = all(_OPS[op](v, float(num)) for op, num in (cond.split() for cond in rule.split(" and ")))
            if not ok:
                problems.append(f"{where}.{name}: must be {rule}, got {value!r}")
                break
    return problems


@dataclass
class LoraOptions:
    """LoRA adapter options (Hu et al. 2021, "LoRA: Low-Rank Adaptation of Large Language Models"),
    applied through peft; the draft LM's `drafter.lora` (null: full fine-tuning)."""

    # Rank of the update B @ A.
    r: int = 16
    # Scale: the update is multiplied by alpha / r.
    alpha: int = 32
    # Dropout on the adapter's input.
    dropout: float = 0.0
    # Names of the linear modules to adapt; null: every linear layer of a Llama block.
    target_modules: Optional[list[str]] = None

    def problems(self, where: str) -> list[str]:
        found = range_problems(self, {"r": ">= 1", "alpha": ">= 1", "dropout": ">= 0 and < 1"}, where)
        if self.target_modules is not None and not self.target_modules:
            found.append(f"{where}.target_modules: must name at least one module, or be null (every Llama linear)")
        return found


class Drafter(nn.Module):
    """Base of every drafter kind (one level of inheritance, no more).

    A subclass sets `kind`, `Config` (a dataclass with commented typed defaults) and
    `required_features`, and implements from_target, forward_loss, make_proposer and
    state_dict_for_export. __init__ builds layers only: no file I/O.
    """

    kind: ClassVar[str] = ""
    Config: ClassVar[type]
    required_features: ClassVar[frozenset[str]] = frozenset()
    # The facts other code asks about a kind (inspect, validate, the matrix, export), answered here so
    # that adding a kind is its own file: nothing outside heads/ lists kinds or switches on them.
    # True when one forward drafts a whole block of tokens (DFlash, DSpark, P-EAGLE), not token by token.
    drafts_block: ClassVar[bool] = False
    # True when the drafter runs its own attention layer with the target's rope (archs.draft_rope): a rope
    # type that layer does not implement refuses the kind (refusals()).
    uses_draft_rope: ClassVar[bool] = False
    # True when the drafter is a whole causal LM sharing the target's tokenizer: `draftsmith eval --draft-model`
    # runs any such model (untrained by draftsmith) as this kind (heads.draft_model_kind()).
    is_draft_model: ClassVar[bool] = False
    # Small options for the architecture matrix (matrix.py) and other smoke runs: one cell trains, drafts
    # and exports in well under a second on one CPU thread.
    tiny_options: ClassVar[dict] = {}
    # True when the kind reads target_logits only through heads/vocab_loss.soft_labels / gathered_soft_labels,
    # so the offline cache's top-K logits can stand in for them (features.label_topk; config refuses the option
    # for any other kind).
    takes_topk_labels: ClassVar[bool] = False
    # Its TTT labels run past the end of a packed document (data.pack_length): only train.loss_on_prompt asks it,
    # and refuses packing for such a kind (without it a packed document's next prompt is no label, so nothing leaks).
    labels_cross_packed_documents: ClassVar[bool] = False

    @classmethod
    def refusals(cls, config) -> list[str]:
        """Why this kind cannot serve a target of transformers `config` ([] when it can): the kind's own
        facts; `draftsmith.support.refusals` adds what every kind and each export layout refuses."""
        from draftsmith.targets.archs import draft_rope_refusals

        return draft_rope_refusals(config) if cls.uses_draft_rope else []

    @classmethod
    def cached_hidden_widths(cls, cfg, target) -> int:
        """Hidden values per token the offline feature cache stores for this kind with options `cfg`:
        one hidden state per aux layer it reads, plus the last hidden state when it reads the target's
        logits (replayed from it) or that state itself. `target` needs num_layers and hidden_size."""
        required = set(cls.required_features)
        blocks = len(cls.feature_layers_for(cfg, target)) if "aux_hidden_states" in required else 0
        blocks += 1 if required & {"last_hidden_state", "target_logits"} else 0
        return blocks * target.hidden_size

    # The option tokens_per_round returns as it is (EAGLE-3's ttt_steps), for messages that name it; None: none does.
    tokens_per_round_option: ClassVar[str | None] = None

    @classmethod
    def tokens_per_round(cls, cfg) -> int | None:
        """The draft tokens one round was trained for, where the kind has such a number (EAGLE-3: its TTT steps; a
        block drafter: one block's drafts; P-EAGLE: its depths): export's default k and the k an engine must run.
        None where heads or stages bound k (max_draft_tokens) or nothing does. A class fact: `draftsmith doctor`
        asks it of a recorded Config without building the drafter."""
        return None

    @classmethod
    def attention_window(cls, cfg) -> int | None:
        """The sliding window the draft's own attention layers were trained with; None: they attend to the whole
        context (and kinds without a draft attention layer)."""
        return None

    @classmethod
    def eagle31_norms(cls, cfg) -> dict[str, bool]:
        """EAGLE 3.1's norm options as trained (norm_before_residual, fc_norm, norm_output); every kind without them
        runs them off."""
        return {"norm_before_residual": False, "fc_norm": False, "norm_output": False}

    def uses_full_vocabulary(self) -> bool:
        """True when the drafter scores the target's whole vocabulary (no reduced draft vocabulary: an export writes
        no d2t / t2d, and llama.cpp's block graphs need it)."""
        d2t, t2d = getattr(self, "d2t", None), getattr(self, "t2d", None)  # the draft-vocabulary buffers, if any
        return d2t is None or t2d is None or d2t.shape[0] == t2d.shape[0]

    def max_draft_tokens(self) -> int | None:
        """The most tokens one proposal can hold (heads, stages or one block's drafts); None: no limit."""
        return None

    @classmethod
    def from_target(cls, cfg, target, token_counts: torch.Tensor | None = None) -> "Drafter":
        """Build from the frozen target; token_counts [V] (target-token frequencies of the
        training data) lets a drafter choose a reduced draft vocabulary."""
        raise NotImplementedError

    @classmethod
    def check_training_start(cls, cfg, target) -> None:
        """Raise UserError (one line naming the option) where this kind cannot START training with options `cfg` on
        `target` (EAGLE-3's layer_init=target from a layer it cannot copy). Asked before any data is read, never when
        a trained drafter is loaded. Default: nothing to check."""

    @classmethod
    def feature_layers_for(cls, cfg, target) -> list[int]:
        """Target layer ids whose hidden states a drafter with options `cfg` reads
        (aux_hidden_states), known before it is built (the offline cache checks them)."""
        return []

    def feature_layers(self) -> list[int]:
        """The layer ids this built drafter reads (kinds with aux features set `aux_layer_ids`)."""
        return list(getattr(self, "aux_layer_ids", []))

    def forward_loss(self, batch: dict[str, torch.Tensor]) -> StepOutput:
        raise NotImplementedError

    def forward(self, batch: dict[str, torch.Tensor]) -> StepOutput:
        """The training loop calls the module (so DDP/FSDP hooks run); this is forward_loss."""
        return self.forward_loss(batch)

    def make_proposer(self, target) -> Proposer:
        raise NotImplementedError

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        """Drafter weights only, never the frozen target tensors."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("target_")}

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]


class FedNodes:
    """Ancestor bookkeeping for a proposer's own tree attention during tree drafting: which fed
    node may attend to which (itself and its fed ancestors)."""

    def __init__(self, device):
        self.anc = torch.zeros(0, 0, dtype=torch.bool, device=device)  # [F, F]

    def __len__(self) -> int:
        return self.anc.shape[0]

    def add(self, parents: torch.Tensor, n_prefix: int) -> torch.Tensor:
        """Feed m nodes with fed-parent indices `parents` [m] -> attention rows [m, n_prefix + F + m]
        (True = attend): the whole prefix, the ancestors among the F earlier fed nodes, itself."""
        m, f = parents.shape[0], len(self)
        rows = torch.zeros(m, f + m, dtype=torch.bool, device=self.anc.device)
        has = parents >= 0
        if has.any():
            rows[has, :f] = self.anc[parents[has]]
        rows[:, f:] = torch.eye(m, dtype=torch.bool, device=self.anc.device)
        grown = torch.zeros(f + m, f + m, dtype=torch.bool, device=self.anc.device)
        grown[:f, :f] = self.anc
        grown[f:] = rows
        self.anc = grown
        prefix = torch.ones(m, n_prefix, dtype=torch.bool, device=self.anc.device)
        return torch.cat([prefix, rows], dim=1)  # [m, n_prefix + F + m]
