"""EAGLE-3 drafter (Li et al. 2025, "EAGLE-3: Scaling up Inference Acceleration of Large
Language Models via Training-Time Test"), with the EAGLE 3.1 options of vLLM's speculators
(`norm_before_residual`, `fc_norm`, `norm_output`).

Architecture (tensor names follow SGLang's LlamaForCausalLMEagle3 so export is a rename-free copy):
  fc_norm.{i}        (fc_norm only) one RMSNorm per aux layer, applied before fc
  fc                 [3h -> h]   fuses the target's low/mid/high hidden states
  midlayer           one decoder layer whose attention reads [norm(embed(x)) ; norm(hidden)] (2h);
                     residual = hidden (or norm(hidden) with norm_before_residual)
  norm, lm_head      final RMSNorm, projection onto the draft vocabulary [h -> dv]; with norm_output
                     the normed state is also what the next step reads (post-norm feedback)
  embed_tokens       the target's frozen embedding (shared, never trained, not in checkpoints)
  d2t, t2d           draft vocabulary: target_id = draft_id + d2t[draft_id]; t2d marks kept target ids

Features read: aux_hidden_states = hidden_states[i] for i in aux_layer_ids (the input of target
layer i); target_logits (the labels).

Pairing (training and inference alike): drafter position j takes (target hidden h_j, token x_{j+1})
and predicts x_{j+2}; its label is the target's distribution at position j+1.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Literal, Optional

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.core.bounds import MAX_DRAFT_TOKENS  # k per round: no engine verifies more
from draftsmith.core.sampling import logits_to_probs
from draftsmith.data import packing
from draftsmith.heads import vocab_loss
from draftsmith.heads.base import DRAFTERS, Drafter, StepOutput, range_problems
from draftsmith.heads.draft_layer import DraftDecoderLayer, KVCache, draft_layer_config, layer_shape_problems, rotary
from draftsmith.heads.proposing import FeatureChainProposer
from draftsmith.heads.shared import (
    Frozen,
    aux_layer_problems,
    draft_ids_of,
    draft_index_of,
    draft_vocabulary,
    on_target_vocab,
    resolve_aux_layer_ids,
)


def init_std_for(fan_in: int, init_std: float, fan_in_cap: bool) -> float:
    """Normal init std of a linear layer with `fan_in` inputs: init_std, capped with fan_in_cap at torch's
    default (Kaiming-uniform, bound 1 / sqrt(fan_in)) std 1 / sqrt(3 * fan_in)."""
    return min(init_std, (3 * fan_in) ** -0.5) if fan_in_cap else init_std


@DRAFTERS.register("eagle3")
class Eagle3Drafter(Drafter):
    kind = "eagle3"
    drafts_block = False
    uses_draft_rope = True
    tiny_options = {"ttt_steps": 2, "draft_vocab_size": 128}
    takes_topk_labels = True  # target_logits only through vocab_loss (soft_labels): features.label_topk
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"})

    @dataclass
    class Config:
        # Target layer ids fused by fc (hidden_states[i] = input of layer i); None: low/mid/high
        # by archs.default_aux_layer_ids ([2, L//2, L-3], made distinct for shallow targets).
        aux_layer_ids: Optional[list[int]] = None
        # Draft vocabulary size (most frequent training-target tokens); None: full vocabulary.
        draft_vocab_size: Optional[int] = None
        # Training-time-test unroll length: how many chained draft steps are trained.
        ttt_steps: int = 7
        # Loss weight of unroll step t is step_decay ** t (later steps matter less; with the other
        # defaults 0.8 beat 1.0 by 0.05 tau on stories260K, docs/benchmarks-history.md "EAGLE-3 ablation").
        step_decay: float = 0.8
        # Draft layer shape; None copies the target's. head_dim may differ from the target's (Model Optimizer's
        # default EAGLE-3 layer: 32 heads x 128, 8 kv heads, intermediate 14336, whatever the target).
        num_heads: Optional[int] = None
        num_kv_heads: Optional[int] = None
        head_dim: Optional[int] = None
        intermediate_size: Optional[int] = None
        # Attention window of the draft layer: a query at position q sees keys at positions > q - sliding_window
        # (in training's TTT unroll and in the loop's KV cache alike); null: full attention.
        sliding_window: Optional[int] = None
        # The attention residual is the normed hidden state instead of the raw one (speculators'
        # norm_before_residual; vLLM and llama.cpp read it, SGLang and TensorRT-LLM cannot run it). No gain
        # on stories260K; on SmolLM2-135M acc_1/acc_2 +0.05/+0.07 at equal tokens (docs/benchmarks.md
        # "Learn-fast on SmolLM2"), so recipes/cpu/eagle3-smollm2-135m.yaml turns it on. Off by default:
        # every engine can serve the default.
        norm_before_residual: bool = False
        # EAGLE 3.1: one RMSNorm per aux layer before fc (the target's layers differ in scale).
        fc_norm: bool = False
        # EAGLE 3.1: the next unroll step reads the post-norm state (post-norm feedback).
        norm_output: bool = False
        # Labels: 0 = soft forward KL against the target's distribution over the draft vocabulary,
        # 1 = cross-entropy on the target's argmax, in between a mix (1-w) * KL + w * CE. Argmax labels
        # train what greedy verification checks; 0.5 and 1.0 tied on stories260K, greedy and at T = 1.
        hard_label_weight: float = 0.5
        # Temperature of the soft labels: p = softmax(target_logits / label_temperature) over the draft
        # vocabulary (1 = the target's own distribution; above 1 spreads the teacher's mass over its
        # runners-up, below 1 sharpens it toward the argmax). The hard-label part is unchanged.
        label_temperature: float = 1.0
        # Start of the draft decoder layer: "random" (init_std), or "target": copied from target layer
        # aux_layer_ids[-1] (the layer whose input the last aux feature is) with fc starting as a selector
        # of that last aux feature, so the drafter starts as that target layer run on its own input
        # (heads/layer_warm_start.py says how the 2h-wide q/k/v start: see layer_init_embed_half); the final norm
        # in front of lm_head takes the target's final norm's scale.
        layer_init: Literal["random", "target"] = "random"
        # layer_init=target: the embedding half of q/k/v starts at "zeros" or as a "copy" of the target's.
        layer_init_embed_half: Literal["zeros", "copy"] = "zeros"
        # Training-time test at a sample of anchor positions: unroll steps 1..ttt_steps-1 run (and take
        # their loss) only at this fraction of the positions, drawn afresh for each batch; step 0 runs at
        # every position (its keys are every later step's prefix). null: every position (the default).
        # Steps >= 1 then cost about this fraction of their full cost (TorchSpec's sampled TTT anchors).
        ttt_anchor_fraction: Optional[float] = None
        # Drop positions whose target argmax lies outside the draft vocabulary from the loss
        # (SpecForge); they can never be accepted, so their soft label only teaches a wrong mode.
        mask_out_of_vocab: bool = False
        # lm_head start: "target" copies the target's lm_head rows of the draft vocabulary;
        # "random" uses init_std.
        lm_head_init: Literal["target", "random"] = "target"
        # Keep lm_head frozen at its start (speculators freezes the copied verifier head).
        freeze_lm_head: bool = False
        # Normal(0, init_std) for every trainable linear layer (HF's initializer_range; lm_head too when
        # lm_head_init=random); None keeps torch's default (Kaiming-uniform) init, which trained slower.
        init_std: Optional[float] = 0.02
        # Cap each linear layer's init std at torch's default std for its fan-in, 1 / sqrt(3 * fan_in)
        # (Kaiming-uniform's), so a wide layer's output projections (o_proj over 32 x 128 heads, down_proj
        # over 14,336) start no larger than torch would start them. No effect while every fan-in is below
        # 1 / (3 * init_std**2) (833 at 0.02), e.g. on stories260K's target-shaped layer.
        init_fan_in_cap: bool = False
        # Uniform noise U(-a, a) added to the aux hidden states during training (EAGLE-1's feature
        # noise); 0 disables it.
        feature_noise: float = 0.0
        # Positions per chunk of the training loss: each chunk's [chunk, dv] fp32 draft logits are
        # recomputed in backward instead of kept for every TTT step (heads/vocab_loss.py; the same loss,
        # tests/heads/test_vocab_loss.py). null computes each step's logits whole and keeps them.
        loss_chunk: Optional[int] = 1024

        def problems(self) -> list[str]:
            """Ranges `config.load` and `draftsmith validate` report (one message per bad option)."""
            out = range_problems(self, {"ttt_steps": f">= 1 and <= {MAX_DRAFT_TOKENS}", "step_decay": "> 0 and <= 1", "draft_vocab_size": ">= 2",
                                        "num_heads": ">= 1", "num_kv_heads": ">= 1", "intermediate_size": ">= 1",
                                        "head_dim": ">= 2", "sliding_window": ">= 1", "aux_layer_ids": ">= 0", "hard_label_weight": ">= 0 and <= 1",
                                        "init_std": "> 0", "feature_noise": ">= 0", "loss_chunk": ">= 1",
                                        "label_temperature": "> 0 and <= 100", "ttt_anchor_fraction": "> 0 and <= 1"})
            out += aux_layer_problems(self.aux_layer_ids) + layer_shape_problems(self)
            if self.freeze_lm_head and self.lm_head_init != "target":
                out.append("drafter.freeze_lm_head needs drafter.lm_head_init=target (a frozen random head learns nothing)")
            return out

    def __init__(self, cfg: "Eagle3Drafter.Config", layer_config, aux_layer_ids: list[int], draft_vocab_size: int,
                 target_vocab_size: int, embed_tokens: nn.Embedding):
        super().__init__()
        h = layer_config.hidden_size
        eps = layer_config.rms_norm_eps
        self.cfg = cfg
        self.layer_config = layer_config
        self.aux_layer_ids = list(aux_layer_ids)
        if cfg.fc_norm:
            self.fc_norm = nn.ModuleList(LlamaRMSNorm(h, eps=eps) for _ in aux_layer_ids)
        self.fc = nn.Linear(len(aux_layer_ids) * h, h, bias=False)
        self.midlayer = DraftDecoderLayer(layer_config, input_size=2 * h)
        self.midlayer.input_layernorm = LlamaRMSNorm(h, eps=eps)
        self.midlayer.hidden_norm = LlamaRMSNorm(h, eps=eps)
        self.norm = LlamaRMSNorm(h, eps=eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.rotary = rotary(layer_config)
        self.embed_tokens = Frozen(embed_tokens)  # the target's: not a parameter, not in state_dict
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(target_vocab_size, dtype=torch.bool))
        if cfg.init_std is not None:
            for module in self.modules():
                if isinstance(module, nn.Linear):
                    nn.init.normal_(module.weight, std=init_std_for(module.in_features, cfg.init_std, cfg.init_fan_in_cap))

    # ------------------------------------------------------------------ construction
    tokens_per_round_option = "ttt_steps"

    @classmethod
    def attention_window(cls, cfg) -> int | None:
        return cfg.sliding_window

    @classmethod
    def eagle31_norms(cls, cfg) -> dict[str, bool]:
        return {"norm_before_residual": bool(cfg.norm_before_residual), "fc_norm": bool(cfg.fc_norm),
                "norm_output": bool(cfg.norm_output)}

    @classmethod
    def tokens_per_round(cls, cfg) -> int:
        return cfg.ttt_steps  # trained to draft ttt_steps tokens a round

    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "Eagle3Drafter":
        # A checkpoint may predate the aux rule (id == num_layers was accepted then): rebuild it as trained.
        # Training refuses such ids before it gets here (heads.check_for_training -> feature_layers_for).
        aux = resolve_aux_layer_ids(cfg.aux_layer_ids, target.num_layers, saved_before_the_rule=True)
        layer_cfg = draft_layer_config(target.config, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size,
                                       cfg.head_dim, cfg.sliding_window)
        V = target.vocab_size
        d2t, t2d = draft_vocabulary(cfg.draft_vocab_size, V, token_counts)
        drafter = cls(cfg, layer_cfg, aux, d2t.shape[0], V, target.embed_tokens)
        drafter.d2t.copy_(d2t)
        drafter.t2d.copy_(t2d)
        if cfg.lm_head_init == "target":
            with torch.no_grad():
                drafter.lm_head.weight.copy_(target.lm_head.weight[drafter.draft_ids()].float())
        drafter.lm_head.weight.requires_grad_(not cfg.freeze_lm_head)
        if cfg.layer_init == "target":
            from draftsmith.heads import layer_warm_start as warm

            layer_id = warm_start_layer(aux, target)
            source = warm.target_layer(target, layer_id)
            warm.copy_layer(drafter.midlayer, drafter.midlayer.hidden_norm, drafter.midlayer.input_layernorm, source,
                            cfg.layer_init_embed_half, f"target layer {layer_id}")
            warm.select_last(drafter.fc, len(aux))
            warm.copy_final_norm(drafter.norm, target)
        return drafter.to(device=target.device)

    @classmethod
    def feature_layers_for(cls, cfg, target) -> list[int]:
        return resolve_aux_layer_ids(cfg.aux_layer_ids, target.num_layers)

    @classmethod
    def check_training_start(cls, cfg, target) -> None:
        if cfg.layer_init == "target":
            from draftsmith.heads import layer_warm_start as warm

            layer_id = warm_start_layer(resolve_aux_layer_ids(cfg.aux_layer_ids, target.num_layers), target)
            warm.check_layer(warm.target_layer(target, layer_id), f"target layer {layer_id}")
            warm.check_final_norm(target)

    def draft_ids(self) -> torch.Tensor:
        """[dv] target ids of the draft vocabulary."""
        return draft_ids_of(self.d2t)

    # ------------------------------------------------------------------ one step
    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        """[b, s, n*h] aux hidden states -> [b, s, h] (per-layer RMSNorm first with fc_norm)."""
        aux = aux.to(self.fc.weight.dtype)
        if self.cfg.fc_norm:
            chunks = aux.chunk(len(self.fc_norm), dim=-1)  # n x [b, s, h]
            aux = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)
        return self.fc(aux)  # [b, s, n*h] -> [b, s, h]

    def step(self, token_ids, hidden, positions, cache: KVCache | None = None, step_kv=None, documents=None,
             anchors=None):
        """[b, n] tokens, [b, n, h] state, [b, n] positions -> [b, n, h] the state the next step reads.
        documents: [b, s] document ids of a packed batch (TTT attention stays inside a document);
        anchors [n] (a TTT step at sampled positions): the positions these n entries stand at."""
        emb = self.embed_tokens[0](token_ids).to(hidden.dtype)  # [b, n] -> [b, n, h]
        layer = self.midlayer
        normed = layer.hidden_norm(hidden)
        attn_input = torch.cat([layer.input_layernorm(emb), normed], dim=-1)  # -> [b, n, 2h]
        residual = normed if self.cfg.norm_before_residual else hidden
        cos, sin = self.rotary(hidden, positions)
        out = layer(attn_input, residual, cos, sin, cache=cache, step_kv=step_kv, documents=documents, positions=positions,
                    anchors=anchors)
        return self.norm(out) if self.cfg.norm_output else out

    def logits(self, state: torch.Tensor) -> torch.Tensor:
        """[b, n, h] step state -> [b, n, dv] draft logits."""
        return self.lm_head(state if self.cfg.norm_output else self.norm(state))

    # ------------------------------------------------------------------ training
    def unroll(self, batch, steps: Optional[int] = None, states: bool = False,
               anchors: Optional[torch.Tensor] = None) -> Iterator[tuple[int, torch.Tensor]]:
        """The training-time-test unroll: yields (t, logits [b, s-1-t, dv]) for t = 0..steps-1, or
        with states=True (t, step state [b, s-1-t, h]) whose `logits` are those logits.

        Step t at index j reads (state_j of step t-1, x_{j+1+t}) at position j+t and predicts
        x_{j+2+t}; step 0's state is the fused target feature. The proposer runs the same steps
        one token at a time, so this is also the teacher-forced chain draft of every position.

        anchors [m] (sorted indices j, ttt_anchor_fraction): steps t >= 1 run only at the anchors below
        s-1-t (a prefix of them, `anchors_at(anchors, s, t)`), and yield [b, m_t, ...] in that order.
        """
        ids = batch["input_ids"]
        b, s = ids.shape
        aux = batch["aux_hidden_states"]
        if self.training and self.cfg.feature_noise > 0:
            aux = aux + (torch.rand_like(aux) * 2 - 1) * self.cfg.feature_noise
        hidden = self.fuse(aux)  # [b, s, n*h] -> [b, s, h]
        step_kv: list = []
        documents = packing.document_ids_of(batch)
        for t in range(steps or self.cfg.ttt_steps):
            n = s - 1 - t
            if n <= 0:
                break
            positions = packing.positions(batch, n) + t  # [b, n] (per document when packed)
            if anchors is not None and t > 0:
                at = anchors_at(anchors, s, t)  # [m_t] the anchors this step still has labels for
                if len(at) == 0:
                    break
                # step 1 reads step 0's state (every index) at the anchors; later steps the anchors' own prefix
                hidden = self.step(ids[:, 1 + t + at], hidden[:, at] if t == 1 else hidden[:, :len(at)],
                                   positions[:, at], step_kv=step_kv, documents=documents, anchors=at)
            else:
                hidden = self.step(ids[:, 1 + t : 1 + t + n], hidden[:, :n], positions, step_kv=step_kv,
                                   documents=documents)
            yield t, hidden if states else self.logits(hidden)

    def forward_loss(self, batch) -> StepOutput:
        """EAGLE-3 training-time test, numbered as in the paper's training recipe:

        1. labels: the target's logits restricted to the draft vocabulary (never a full-vocabulary
           fp32 copy), their argmax in target ids, and which argmaxes the draft vocabulary holds;
        2. unroll t = 0..ttt_steps-1 (see `unroll`);
        3. loss_t = (1-w) * KL(p || q) + w * CE(argmax p) summed over positions whose predicted
           token is in the loss mask (minus out-of-vocabulary argmaxes with mask_out_of_vocab),
           weighted by step_decay ** t; the sum is normalised by the caller (see StepOutput).
           It runs loss_chunk positions at a time, each chunk's draft logits recomputed in backward
           (vocab_loss.chunked_loss), so no step keeps [b, n, dv] fp32 logits alive.
        """
        cfg = self.cfg
        ids = batch["input_ids"]
        b, s = ids.shape
        mask = (batch["loss_mask"] * batch["attention_mask"]).float()
        mask = torch.cat([mask, mask.new_zeros(b, 1)], dim=1)  # [b, s] -> [b, s+1]: no label past the end
        draft_ids = self.draft_ids()  # [dv] target ids of the draft vocabulary
        target_logits = batch["target_logits"]  # [b, s, V], any dtype
        chunk = cfg.loss_chunk or s
        p, target_top = vocab_loss.soft_labels(target_logits, draft_ids, chunk, cfg.label_temperature)  # 1. [b, s, dv] fp32, [b, s] ids
        draft_index = draft_index_of(draft_ids, len(self.t2d))  # [V] target id -> draft id, -1 outside
        in_vocab = draft_index[target_top] >= 0  # [b, s]
        hard = draft_index[target_top].clamp_min(0)  # [b, s] draft id of the argmax
        if cfg.mask_out_of_vocab:
            mask[:, 1:] = mask[:, 1:] * in_vocab.float()  # mask[i + 1] is the label at position i
        total = p.new_zeros(())
        sums: dict[str, torch.Tensor] = {}
        num_tokens = int((mask[:, 2:] * packing.valid_labels(batch, 2, s - 1)).sum())  # packed: labels in j's document
        anchors = sample_anchors(s - 1, cfg.ttt_anchor_fraction, ids.device) if self.training else None
        for t, state in self.unroll(batch, states=True, anchors=anchors):  # 2.
            n = state.shape[1]
            scale = 1.0
            if anchors is not None and t > 0:  # the anchors' labels only, scaled up to the whole step's weight
                at = anchors_at(anchors, s, t)
                m = mask[:, 2 + t + at] * _cols(packing.valid_labels(batch, 2 + t, s - 1 - t), at)
                labels, scale = 1 + t + at, (s - 1 - t) / len(at)
            else:
                m = mask[:, 2 + t : 2 + t + n] * packing.valid_labels(batch, 2 + t, n)
                labels = slice(1 + t, 1 + t + n)
            loss, hits = vocab_loss.chunked_loss(  # 3. [b, n] per position, summed under m, chunk by chunk
                state, self.logits, p[:, labels], m, draft_ids, target_top[:, labels], chunk,
                hard[:, labels], in_vocab[:, labels].float(), cfg.hard_label_weight, recompute=cfg.loss_chunk is not None)
            total = total + (cfg.step_decay**t) * scale * loss
            sums[f"acc_{t}"] = hits
            sums[f"loss_{t}"] = loss.detach()
            sums[f"tokens_{t}"] = m.sum()
        metrics, weights = {}, {}
        for key, value in sums.items():
            if not key.startswith("tokens_"):
                t = key.rsplit("_", 1)[1]
                metrics[key] = float(value / sums[f"tokens_{t}"].clamp_min(1.0))
                weights[key] = float(sums[f"tokens_{t}"])  # pooled by tokens over micro-batches and ranks
        return StepOutput(loss=total, metrics=metrics, weights=weights, num_tokens=num_tokens)

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> "Eagle3Proposer":
        return Eagle3Proposer(self, target)


def warm_start_layer(aux: list[int], target) -> int:
    """The target layer layer_init=target copies: the one whose input the last aux feature is."""
    return min(aux[-1], target.num_layers - 1)


def sample_anchors(n: int, fraction: Optional[float], device) -> Optional[torch.Tensor]:
    """[m] sorted random indices of 0..n-1, m = ceil(fraction * n) (None: every index, no sampling)."""
    if fraction is None or fraction >= 1.0 or n <= 0:
        return None
    m = max(1, math.ceil(fraction * n))
    return torch.randperm(n, device=device)[:m].sort().values


def anchors_at(anchors: torch.Tensor, s: int, t: int) -> torch.Tensor:
    """The anchors unroll step t of a length-s row still has: those below s - 1 - t (a prefix: sorted)."""
    return anchors[: int((anchors < s - 1 - t).sum())]


def _cols(values, at: torch.Tensor):
    """values [b, n] at columns `at`, or a scalar as it is (valid_labels of an unpacked batch)."""
    return values[:, at] if torch.is_tensor(values) else values


class Eagle3Proposer(FeatureChainProposer):
    """Chain / tree drafting with the drafter's own KV cache (heads/proposing.py); a committed token reads
    the fused aux hidden states; draft logits cover the draft vocabulary (-inf elsewhere)."""

    name = "eagle3"

    def __init__(self, drafter: Eagle3Drafter, target):
        super().__init__(drafter)
        self.vocab_size = target.vocab_size
        self.draft_ids = drafter.draft_ids()

    def features(self, target_out) -> torch.Tensor:
        aux = torch.cat([target_out.hidden_states[i] for i in self.drafter.aux_layer_ids], dim=-1)  # [1, m, 3h]
        return self.drafter.fuse(aux)  # [1, m, 3h] -> [1, m, h]

    def target_probs(self, draft_logits: torch.Tensor, sampling) -> torch.Tensor:
        """[dv] draft logits -> [V] probabilities over the target vocabulary (same transform as p)."""
        return logits_to_probs(on_target_vocab(draft_logits.float(), self.draft_ids, self.vocab_size), sampling)

    def target_logprobs(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """[m, dv] draft logits -> [m, V] log-probabilities over the target vocabulary (-inf off the draft vocab)."""
        return on_target_vocab(torch.log_softmax(draft_logits.float(), dim=-1), self.draft_ids, self.vocab_size)

    _target_probs, _target_logprobs = target_probs, target_logprobs  # the names tests and benches use
