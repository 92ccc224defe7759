"""Medusa heads (Cai et al. 2024, "Medusa: Simple LLM Inference Acceleration Framework with
Multiple Decoding Heads").

Architecture (tensor names follow vLLM's Medusa loader, so export is a rename-free copy):
  blocks.{i}.layers.{j}   head i's residual block j: x <- x + SiLU(Linear(x)) (weight and bias
                          zero-initialised, so an untrained head equals its vocabulary projection)
  lm_heads.{i}            head i's vocabulary projection [h -> V], initialised from the target's lm_head
                          ([h -> dv] rows of the draft vocabulary with draft_vocab_size)
  d2t                     (draft_vocab_size only) target_id = draft_id + d2t[draft_id], as EAGLE-3's

Feature read: last_hidden_state = hidden_states[num_layers], AFTER the target's final norm (the
lm_head input). Every head reads the SAME state.

Indexing (the paper's sec. 2.1.1: "the k-th head predicts the token at position t+k+1; the original
lm_head predicts t+1"): the target state h_j at position j predicts x_{j+1} through the target's own
lm_head; head i (0-based) on h_j predicts x_{j+2+i}. At inference h is the state whose next token is
the newest committed token c, so head i proposes the (i+1)-th token after c: draft token i+1. vLLM
reads heads the same way (v1/spec_decode/medusa.py: head i's argmax on the sampled position's state
is draft token i). `next_token_head` selects Model Optimizer's convention instead (head i predicts
x_{j+1+i}: head 0 repeats the target's own next token, and the proposer skips it); vLLM export refuses it.

Labels. The target-argmax labels at j+1+i condition on the data tokens x_{j+1..j+1+i}, which the
head on h_j never sees; on sampled data those are often not the target's greedy tokens, while at
greedy inference head i is only ever asked for the greedy continuation. `greedy_path_only` keeps the
positions whose data tokens are greedy; `greedy_chain_labels` computes the greedy continuation of
every prefix with tree-masked target forwards and labels every position with it.

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

from draftsmith.core.bounds import MAX_DRAFT_TOKENS  # k per round: no engine verifies more
from draftsmith.core.errors import UserError
from draftsmith.core.sampling import logits_to_probs
from draftsmith.data import packing
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, StepOutput, range_problems
from draftsmith.heads.proposing import LastStateProposer, draw
from draftsmith.heads.shared import Frozen, draft_ids_of, draft_index_of, draft_vocabulary, on_target_vocab


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
    tiny_options = {"num_heads": 2}
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "last_hidden_state", "target_logits"})

    @dataclass
    class Config:
        # Number of heads; head i predicts the token i+2 positions after the state's own position.
        num_heads: int = 4
        # Residual blocks per head (vLLM's num_hidden_layers of a Medusa config).
        num_layers: int = 1
        # Draft vocabulary: each head projects onto the draft_vocab_size most frequent target tokens of the
        # training data (as EAGLE-3's; rows of the target's lm_head) instead of the full vocabulary; positions
        # whose label lies outside it are dropped from the loss (no head could propose it). None: full vocabulary.
        # On a 262k-vocabulary target (Gemma-3) a full head costs 168M multiply-adds per proposed token.
        draft_vocab_size: Optional[int] = None
        # Head-index convention. false (the Medusa paper, vLLM): head i on the state whose next token is
        # c predicts the (i+1)-th token after c, x_{j+2+i}. true (Model Optimizer): head 0 predicts the
        # target's own next token x_{j+1} and head i predicts x_{j+1+i}; head 0 then duplicates the
        # target's lm_head, the proposer skips it, and n heads propose n-1 tokens. vLLM reads the first
        # convention, so export refuses the second.
        next_token_head: bool = False
        # Labels: "ce" = hard CE on the target's greedy token at that offset; "kl" = forward KL to the
        # target's distribution there; "mix" = (1 - hard_label_weight) * KL + hard_label_weight * CE;
        # "ce_data" = hard CE on the data token (Medusa-1 on raw data, Model Optimizer's loss).
        loss: Literal["ce", "kl", "mix", "ce_data"] = "ce"
        hard_label_weight: float = 0.5
        # Weight of head i is head_decay ** i (the Medusa repo uses 0.8), unless head_weights is given.
        head_decay: float = 0.8
        head_weights: Optional[list[float]] = None
        # Labels from the target's own greedy continuation of every prefix instead of the data tokens
        # after it: head i's label is the target at x_{<=j}, g_1 .. g_{o-1+i} (g_1 = its argmax at j,
        # g_{m+1} its argmax after g_1..g_m), computed by one tree-masked target forward per head.
        # At greedy inference head i is asked for exactly that token; with sampled data the tokens
        # after x_j are often not the target's own, and the plain label then conditions on them.
        greedy_chain_labels: bool = False
        # (greedy_chain_labels makes greedy_path_only moot: its labels are on the greedy path everywhere.)
        # Train head i at position j only where the data tokens between j and its label follow the
        # target's greedy path (x_{j+1+m} = argmax p_{j+m}): at greedy inference the head is only ever
        # asked about such continuations, and elsewhere its label depends on a sampled token it cannot see.
        greedy_path_only: bool = True
        # Residual-block start: "zero" (weight and bias zero: an untrained head is its vocabulary
        # projection; the Medusa repo) or "normal" (weight ~ Normal(0, block_init_std), bias zero).
        block_init: Literal["zero", "normal"] = "zero"
        block_init_std: float = 0.02
        # Initialise every head's vocabulary projection from the target's lm_head (else torch's default).
        init_lm_head_from_target: bool = True
        # Keep the vocabulary projections frozen at the target's lm_head: only the residual blocks train.
        freeze_lm_head: bool = False
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
            out = range_problems(self, {"num_heads": f">= 1 and <= {MAX_DRAFT_TOKENS}", "num_layers": ">= 0", "head_decay": "> 0", "draft_vocab_size": ">= 2",
                                        "head_weights": ">= 0", "lora_r": ">= 1", "lora_alpha": ">= 1",
                                        "lora_dropout": ">= 0 and < 1", "lora_kl_weight": ">= 0"})
            if self.head_weights is not None and len(self.head_weights) != self.num_heads:
                out.append(f"drafter.head_weights: has {len(self.head_weights)} entries; give one per head "
                           f"(drafter.num_heads = {self.num_heads})")
            return out

    def __init__(self, cfg: "MedusaDrafter.Config", hidden_size: int, vocab_size: int):
        super().__init__()
        if cfg.num_heads < 1 or cfg.num_layers < 0:
            raise UserError(f"drafter.num_heads ({cfg.num_heads}) must be >= 1 and drafter.num_layers "
                             f"({cfg.num_layers}) >= 0")
        if cfg.head_weights is not None and len(cfg.head_weights) != cfg.num_heads:
            raise UserError(f"drafter.head_weights has {len(cfg.head_weights)} entries; give one per head "
                             f"(drafter.num_heads = {cfg.num_heads})")
        if cfg.next_token_head and cfg.num_heads < 2:
            raise UserError("drafter.next_token_head=true needs drafter.num_heads >= 2 (head 0 proposes nothing)")
        if not 0.0 <= cfg.hard_label_weight <= 1.0:
            raise UserError(f"drafter.hard_label_weight must lie in [0, 1], got {cfg.hard_label_weight}")
        if cfg.greedy_chain_labels and (cfg.loss == "ce_data" or cfg.lora):
            raise UserError("drafter.greedy_chain_labels=true takes its labels from the target's greedy continuation: "
                             "it cannot be combined with loss=ce_data or lora")
        if cfg.block_init_std <= 0:
            raise UserError(f"drafter.block_init_std must be > 0, got {cfg.block_init_std}")
        if cfg.freeze_lm_head and not cfg.init_lm_head_from_target:
            raise UserError("drafter.freeze_lm_head needs drafter.init_lm_head_from_target=true "
                             "(a frozen random projection learns nothing)")
        self.cfg = cfg
        self.blocks = nn.ModuleList([ResidualBlock(hidden_size, cfg.num_layers) for _ in range(cfg.num_heads)])
        if cfg.block_init == "normal":
            with torch.no_grad():
                for block in self.blocks:
                    for layer in block.layers:
                        layer.weight.normal_(0.0, cfg.block_init_std)
        out_size = cfg.draft_vocab_size or vocab_size
        self.lm_heads = nn.ModuleList([nn.Linear(hidden_size, out_size, bias=False) for _ in range(cfg.num_heads)])
        self.vocab_size = vocab_size
        if cfg.draft_vocab_size:
            self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.long))
        self.adapted: Frozen | None = None  # Medusa-2: the peft model (its LoRA weights are registered as self.lora)
        self.teacher: Frozen | None = None  # greedy_chain_labels: the frozen target
        if cfg.lora:
            self.required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "target_logits"})

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "MedusaDrafter":
        drafter = cls(cfg, target.hidden_size, target.vocab_size)
        if cfg.draft_vocab_size:
            drafter.d2t.copy_(draft_vocabulary(cfg.draft_vocab_size, target.vocab_size, token_counts)[0])
        if cfg.init_lm_head_from_target:
            rows = drafter.draft_ids()
            with torch.no_grad():
                for head in drafter.lm_heads:
                    head.weight.copy_(target.lm_head.weight.float() if rows is None else target.lm_head.weight[rows].float())
        for head in drafter.lm_heads:
            head.weight.requires_grad_(not cfg.freeze_lm_head)
        drafter = drafter.to(device=target.device)
        if cfg.greedy_chain_labels:
            drafter.teacher = Frozen(target)
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
            raise UserError(f"drafter.lora_target_modules {c.lora_target_modules} matched no module of the target")
        self.lora = nn.ParameterDict(trainable)
        self.adapted = Frozen(model)

    def draft_ids(self) -> torch.Tensor | None:
        """[dv] target ids of the draft vocabulary; None with the full vocabulary."""
        if not self.cfg.draft_vocab_size:
            return None
        return draft_ids_of(self.d2t)

    def to_target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """[..., dv] head logits -> [..., V] over the target vocabulary (-inf off the draft vocabulary)."""
        ids = self.draft_ids()
        if ids is None:
            return logits
        return on_target_vocab(logits, ids, self.vocab_size)

    def max_draft_tokens(self) -> int:
        return self.cfg.num_heads  # one token per head

    def save_adapter(self, path) -> None:
        """Write the Medusa-2 LoRA adapter as a standard peft adapter directory."""
        if not self.adapted:
            raise UserError("save_adapter: this Medusa drafter has no LoRA adapter (set drafter.lora=true)")
        self.adapted[0].save_pretrained(str(path))

    def head_weights(self) -> list[float]:
        return list(self.cfg.head_weights or [self.cfg.head_decay**i for i in range(self.cfg.num_heads)])

    @property
    def offset(self) -> int:
        """Head i at position j predicts x_{j + offset + i}: 2 (Medusa, vLLM) or 1 (next_token_head)."""
        return 1 if self.cfg.next_token_head else 2

    @property
    def proposing_heads(self) -> int:
        """Heads the proposer uses (a next-token head 0 only repeats the committed token)."""
        return self.cfg.num_heads - (1 if self.cfg.next_token_head else 0)

    def head_logits(self, hidden: torch.Tensor) -> list[torch.Tensor]:
        """[b, n, h] states -> num_heads x [b, n, V] ([b, n, dv] with a draft vocabulary); entry i predicts
        the token offset+i positions on."""
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

    @torch.no_grad()
    def greedy_chain_logits(self, batch, depth: int) -> list[torch.Tensor]:
        """Target logits along every prefix's own greedy continuation (a tree of s branches, one
        target forward per level): entry d [b, s, V] at base position j is the target's distribution
        after x_{<=j}, g_1..g_d, where g_1 = argmax of entry 0 (the batch's target_logits) at j and
        g_{d+1} = argmax of entry d. Level d's token at base j sits at position j + d and attends to
        x_{<=j} and the branch tokens g_1..g_d of the same j only."""
        if not self.teacher:
            raise RuntimeError("greedy_chain_logits needs the target: build the drafter with from_target")
        target = self.teacher[0]
        ids, attention = batch["input_ids"], batch["attention_mask"]
        b, s = ids.shape
        dev = ids.device
        out = [batch["target_logits"]]
        branch: list[torch.Tensor] = []
        base = torch.arange(s, device=dev)
        for d in range(1, depth + 1):
            branch.append(out[-1].argmax(-1))  # g_d: [b, s]
            inputs = torch.cat([ids, *branch], 1)  # [b, (d+1) s]
            level = torch.arange(d + 1, device=dev).repeat_interleave(s)  # [(d+1) s]
            j = base.repeat(d + 1)  # [(d+1) s]: each token's base position
            allowed = ((level[None, :] == 0) & (j[None, :] <= j[:, None])) | (
                (level[None, :] >= 1) & (level[None, :] <= level[:, None]) & (j[None, :] == j[:, None]))
            keys = torch.cat([attention.bool(), attention.new_ones(b, d * s).bool()], 1)  # [b, (d+1) s]
            allowed = allowed[None] & keys[:, None, :]  # [b, (d+1) s, (d+1) s]
            dtype = target.model.dtype
            mask = torch.zeros(allowed.shape, dtype=dtype, device=dev).masked_fill(~allowed, torch.finfo(dtype).min)
            logits = target.forward(inputs, attention_mask=mask[:, None], position_ids=(j + level)[None].expand(b, -1)).logits
            out.append(logits[:, d * s :])  # [b, (d+1) s, V] -> [b, s, V]: the newest level
        return out

    def forward_loss(self, batch) -> StepOutput:
        """Medusa training (Cai et al. 2024, sec. 2.2), numbered:

        1. the state every head reads: h_j (the target's, or the adapted target's for Medusa-2);
        2. head i at position j predicts x_{j+o+i} (o = self.offset: 2, or 1 with next_token_head);
           its label is the target's greedy token argmax p_{j+o-1+i} ("ce"), the distribution
           p_{j+o-1+i} ("kl"), their mix ("mix"), or the data token x_{j+o+i} ("ce_data");
           with greedy_chain_labels p is the target's distribution after x_{<=j} and its own greedy
           tokens g_1..g_{o-1+i} instead (greedy_chain_logits), at every j whose x_{j+1} is a loss token;
        3. positions count where the predicted token is in the loss mask (and, with greedy_path_only,
           where x_{j+1}..x_{j+o-1+i} are the target's greedy tokens);
        4. loss_i summed over those positions, weighted by head_weights[i]; plus lora_kl_weight *
           KL(frozen || adapted) for Medusa-2. The sum is normalised by the caller over num_tokens
           (the loss-mask count of head 0's positions, as EAGLE-3's step 0).
        """
        c = self.cfg
        ids = batch["input_ids"]
        b, s = ids.shape
        o = self.offset
        mask = (batch["loss_mask"] * batch["attention_mask"]).float()
        hidden, kl_lm = self._features(batch)  # 1.
        target_logits = batch["target_logits"].float()
        greedy = target_logits.argmax(-1)  # [b, s, V] -> [b, s]
        on_path = (ids[:, 1:] == greedy[:, :-1]).float()  # [b, s-1]: x_{j+1} is the target's greedy token
        chain = self.greedy_chain_logits(batch, o - 2 + c.num_heads) if c.greedy_chain_labels else None
        draft_ids = self.draft_ids()  # [dv] or None
        if draft_ids is not None:
            draft_index = draft_index_of(draft_ids, self.vocab_size)  # [V] -> draft id or -1
        total = c.lora_kl_weight * kl_lm if self.adapted else kl_lm.new_zeros(())
        metrics: dict[str, float] = {"loss_lora_kl": float(kl_lm.detach())} if self.adapted else {}
        weights: dict[str, float] = {}
        for i, (logits, w) in enumerate(zip(self.head_logits(hidden), self.head_weights())):  # 2.
            n = s - 1 if chain is not None else s - o - i
            if n <= 0:
                break
            logq = torch.log_softmax(logits[:, :n].float(), -1)  # [b, n, V]
            if chain is not None:  # the label at j is the chain's, for every j whose next token is a loss token
                p_logits, m = chain[o - 1 + i][:, :n].float(), mask[:, 1:] * packing.valid_labels(batch, 1, n)
            else:
                p_logits = target_logits[:, o - 1 + i : o - 1 + i + n]  # [b, n, V]
                m = mask[:, o + i : o + i + n] * packing.valid_labels(batch, o + i, n)  # 3. packed: label in j's document
            if c.greedy_path_only and chain is None:
                for step in range(o - 1 + i):  # x_{j+1+step} must be greedy for step < o-1+i
                    m = m * on_path[:, step : step + n]
            labels = ids[:, o + i : o + i + n] if c.loss == "ce_data" else p_logits.argmax(-1)  # [b, n] target ids
            if draft_ids is not None:  # labels in draft ids; out-of-vocabulary labels leave the loss
                m = m * (draft_index[labels] >= 0).float()
                labels = draft_index[labels].clamp_min(0)
                p_logits = p_logits[..., draft_ids]  # [b, n, dv]: the target restricted to the draft vocabulary
            ce = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)  # [b, n]
            if c.loss in ("kl", "mix"):
                logp = torch.log_softmax(p_logits, -1)
                kl = (logp.exp() * (logp - logq)).sum(-1)  # [b, n]
                per = kl if c.loss == "kl" else (1 - c.hard_label_weight) * kl + c.hard_label_weight * ce
            else:
                per = ce
            total = total + w * (per * m).sum()  # 4.
            with torch.no_grad():
                denom = m.sum().clamp_min(1.0)
                metrics[f"acc_{i}"] = float(((logq.argmax(-1) == labels).float() * m).sum() / denom)
                metrics[f"loss_{i}"] = float((per * m).sum() / denom)
                weights[f"acc_{i}"] = weights[f"loss_{i}"] = float(m.sum())  # pooled by tokens
        start = 1 if chain is not None else o
        return StepOutput(loss=total, metrics=metrics, weights=weights,
                          num_tokens=int((mask[:, start:] * packing.valid_labels(batch, start, s - start)).sum()))

    # ------------------------------------------------------------------ export and inference
    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        """vLLM's Medusa weights: blocks.{i}.layers.{j}.weight/.bias and lm_heads.{i}.weight only
        (a Medusa-2 adapter is exported separately with save_adapter)."""
        return {k: v for k, v in self.state_dict().items() if k.startswith(("blocks.", "lm_heads."))}

    def make_proposer(self, target) -> "MedusaProposer":
        return MedusaProposer(self)


class MedusaProposer(LastStateProposer):
    """Chain proposals from the heads on one state (no KV cache, no draft recurrence).

    commit() keeps h, the target state whose next token is the newest committed token c
    (heads/proposing.py); propose(k) returns head i's token for i < k, i.e. the (i+1)-th token after c.
    """

    name = "medusa"

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        n = self.drafter.proposing_heads
        if k > n:
            raise UserError(f"Medusa proposes at most one token per head: k={k} > num_heads={n}"
                             f"{' (head 0 predicts the next token)' if self.drafter.cfg.next_token_head else ''}; "
                             f"lower k (eval --k) to <= {n} or train more heads (drafter.num_heads)")
        self.state("propose")
        tokens, probs = [], []
        skip = self.drafter.cfg.num_heads - n  # a next-token head 0 would repeat the committed token
        for block, head in list(zip(self.drafter.blocks, self.drafter.lm_heads))[skip : skip + k]:
            x = self.last_hidden.to(head.weight.dtype)
            q = logits_to_probs(self.drafter.to_target_logits(head(block(x))[0, -1]), sampling)  # [1, 1, h] -> [V]
            tokens.append(draw(q, sampling, generator))
            probs.append(q)
        return Draft(tokens=torch.stack(tokens).view(-1), probs=torch.stack(probs))

    # ------------------------------------------------------------------ tree drafting (eval/tree.py)
    @property
    def max_tree_depth(self) -> int:
        return self.drafter.cfg.num_heads

    def _head_logprobs(self, i: int) -> torch.Tensor:
        block, head = self.drafter.blocks[i], self.drafter.lm_heads[i]
        logits = self.drafter.to_target_logits(head(block(self.last_hidden.to(head.weight.dtype)))[0, -1].float())
        return torch.log_softmax(logits, -1)  # [V]

    @torch.no_grad()
    def tree_root(self) -> torch.Tensor:
        self.state("tree_root")
        return self._head_logprobs(0)

    @torch.no_grad()
    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        """Medusa heads read one state: the children of every node at `depth` come from head `depth`."""
        return self._head_logprobs(depth).expand(tokens.shape[0], -1)  # [m, V]
