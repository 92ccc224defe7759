"""P-EAGLE drafter (parallel EAGLE; AWS, "P-EAGLE: Parallel Drafting EAGLE with Scalable Training",
2026; served by vLLM, trained by speculators.models.peagle): an EAGLE-3-style head that drafts k
tokens in ONE forward. Position 0 reads the real (target hidden, token) pair as EAGLE-3 does; the
k - 1 later positions read placeholders (the embedding of mask_token_id and a learned
`mask_hidden` in place of the target's features), so none of them waits for an earlier draft.

Architecture (names as draftsmith's EAGLE-3, so export reuses its layout; speculators adds
mask_hidden): fc [n*h -> h], midlayer (one decoder layer over [norm(embed(x)) ; norm(hidden)],
residual = hidden), norm, lm_head, embed_tokens (the drafter's OWN copy of the target's embedding,
trained, as the authors do), mask_hidden [1, 1, n*h], d2t / t2d.

Pairing (as EAGLE-3): pair j = (target hidden h_j, token x_{j+1}) predicts x_{j+2}. A depth-d
element of the chain anchored at pair a sits at position a + d, reads a placeholder, and predicts
x_{a+d+2}; it attends to real pairs <= a and to its own chain's depths <= d.

Training (the authors' conditional-on-distribution sampling, COD): depth 0 keeps every pair;
depth d keeps a random subset of depth d-1's anchors of size n * max(r^d, r_min), so the number of
trained elements grows like n / (1 - r) instead of n * k. All elements run in one forward under the
mask above; the loss is forward KL to the target's distribution, equally weighted across depths.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
from torch import nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

from draftsmith.core.bounds import MAX_DRAFT_TOKENS  # k per round: no engine verifies more
from draftsmith.core.errors import UserError
from draftsmith.core.sampling import logits_to_probs, sample
from draftsmith.heads import vocab_loss
from draftsmith.heads.base import DRAFTERS, Draft, Drafter, StepOutput, range_problems
from draftsmith.heads.block import BlockDrafting
from draftsmith.heads.draft_layer import DraftDecoderLayer, KVCache, draft_layer_config, rotary
from draftsmith.heads.shared import (
    aux_layer_problems,
    draft_ids_of,
    draft_vocabulary,
    on_target_vocab,
    resolve_aux_layer_ids,
)


@DRAFTERS.register("peagle")
class PEagleDrafter(Drafter):
    kind = "peagle"
    drafts_block = True
    uses_draft_rope = True
    tiny_options = {"num_depths": 3}
    takes_topk_labels = True  # target_logits only through vocab_loss (gathered_soft_labels): features.label_topk
    labels_cross_packed_documents = True  # its depth labels take no document mask (train.loss_on_prompt refuses packing)
    required_features = frozenset({"input_ids", "attention_mask", "loss_mask", "aux_hidden_states", "target_logits"})

    @dataclass
    class Config:
        # Target layer ids fused by fc (hidden_states[i] = input of layer i); None: EAGLE-3's low/mid/high.
        aux_layer_ids: Optional[list[int]] = None
        # Parallel depths trained (k drafted per forward at most): the authors' K.
        num_depths: int = 5
        # COD sampling: depth d keeps max(down_sample_ratio ** d, down_sample_ratio_min) of the anchors.
        down_sample_ratio: float = 0.7
        down_sample_ratio_min: float = 0.2
        # Token id whose embedding fills the placeholder positions; None: the tokenizer's pad (else unk) id.
        mask_token_id: Optional[int] = None
        # Train the drafter's own copy of the embedding (the authors and speculators do).
        train_embedding: bool = True
        # Draft vocabulary size (most frequent training-target tokens); None: full vocabulary.
        draft_vocab_size: Optional[int] = None
        # Draft layer shape; None copies the target's.
        num_heads: Optional[int] = None
        num_kv_heads: Optional[int] = None
        intermediate_size: Optional[int] = None
        # Attention window: an element at position q sees keys at positions > q - sliding_window (training's
        # one-forward mask and the loop's KV cache alike); null: full attention.
        sliding_window: Optional[int] = None

        def problems(self) -> list[str]:
            """Ranges `config.load` and `draftsmith validate` report (one message per bad option)."""
            return range_problems(self, {"num_depths": f">= 1 and <= {MAX_DRAFT_TOKENS}", "down_sample_ratio": "> 0 and <= 1", "down_sample_ratio_min": "> 0 and <= 1", "mask_token_id": ">= 0", "draft_vocab_size": ">= 2", "num_heads": ">= 1", "num_kv_heads": ">= 1", "intermediate_size": ">= 1", "sliding_window": ">= 1", "aux_layer_ids": ">= 0"}) + aux_layer_problems(self.aux_layer_ids)

    def __init__(self, cfg, layer_config, aux_layer_ids: list[int], draft_vocab_size: int, target_vocab_size: int,
                 mask_token_id: int):
        super().__init__()
        h = layer_config.hidden_size
        self.cfg = cfg
        self.layer_config = layer_config
        self.aux_layer_ids = list(aux_layer_ids)
        self.mask_token_id = mask_token_id
        self.fc = nn.Linear(len(aux_layer_ids) * h, h, bias=False)
        self.midlayer = DraftDecoderLayer(layer_config, input_size=2 * h)
        self.midlayer.input_layernorm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.midlayer.hidden_norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.norm = LlamaRMSNorm(h, eps=layer_config.rms_norm_eps)
        self.lm_head = nn.Linear(h, draft_vocab_size, bias=False)
        self.embed_tokens = nn.Embedding(target_vocab_size, h)
        self.embed_tokens.weight.requires_grad_(cfg.train_embedding)
        self.mask_hidden = nn.Parameter(torch.randn(1, 1, len(aux_layer_ids) * h) * 0.02)
        self.rotary = rotary(layer_config)
        self.register_buffer("d2t", torch.zeros(draft_vocab_size, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(target_vocab_size, dtype=torch.bool))

    @property
    def block_size(self) -> int:
        return self.cfg.num_depths

    # ------------------------------------------------------------------ construction
    tokens_per_round_option = "num_depths"

    @classmethod
    def attention_window(cls, cfg) -> int | None:
        return cfg.sliding_window

    @classmethod
    def tokens_per_round(cls, cfg) -> int:
        return cfg.num_depths  # one forward drafts num_depths tokens

    @classmethod
    def from_target(cls, cfg, target, token_counts=None) -> "PEagleDrafter":
        if cfg.num_depths < 1:
            raise UserError(f"drafter.num_depths {cfg.num_depths}: needs >= 1")
        if not 0 < cfg.down_sample_ratio_min <= cfg.down_sample_ratio <= 1:
            raise UserError(f"drafter.down_sample_ratio {cfg.down_sample_ratio} / down_sample_ratio_min "
                             f"{cfg.down_sample_ratio_min}: need 0 < min <= ratio <= 1")
        aux = cls.feature_layers_for(cfg, target)
        layer_cfg = draft_layer_config(target.config, cfg.num_heads, cfg.num_kv_heads, cfg.intermediate_size,
                                       sliding_window=cfg.sliding_window)
        V = target.vocab_size
        d2t, t2d = draft_vocabulary(cfg.draft_vocab_size, V, token_counts)
        mask = BlockDrafting.resolve_mask_token(cfg, target)
        drafter = cls(cfg, layer_cfg, aux, d2t.shape[0], V, mask)
        with torch.no_grad():
            drafter.d2t.copy_(d2t)
            drafter.t2d.copy_(t2d)
            drafter.embed_tokens.weight.copy_(target.embed_tokens.weight.float())
            drafter.lm_head.weight.copy_(target.lm_head.weight[drafter.draft_ids()].float())
        return drafter.to(device=target.device)

    @classmethod
    def feature_layers_for(cls, cfg, target) -> list[int]:
        return resolve_aux_layer_ids(cfg.aux_layer_ids, target.num_layers)

    def draft_ids(self) -> torch.Tensor:
        return draft_ids_of(self.d2t)

    # ------------------------------------------------------------------ one forward
    def layer_input(self, token_ids, hidden):
        """[b, n] tokens, [b, n, h] fused hidden -> attention input [b, n, 2h]."""
        layer = self.midlayer
        emb = self.embed_tokens(token_ids).to(hidden.dtype)  # [b, n] -> [b, n, h]
        return torch.cat([layer.input_layernorm(emb), layer.hidden_norm(hidden)], dim=-1)

    def run(self, token_ids, hidden, positions, cache: KVCache | None = None, mask=None):
        """[b, n] tokens, [b, n, h] hidden, [b, n] positions -> [b, n, h] pre-norm output; attends to the
        cache (inference) or under an explicit [b, 1, n, n] bool mask (training)."""
        layer = self.midlayer
        x = self.layer_input(token_ids, hidden)
        cos, sin = self.rotary(hidden, positions)
        if cache is not None:
            return layer(x, hidden, cos, sin, cache=cache, positions=positions)
        attn = layer.self_attn
        q, k, v = attn.project(x, cos, sin)  # [b, H|KV, n, d]
        o = torch.nn.functional.scaled_dot_product_attention(q, attn._expand(k), attn._expand(v), attn_mask=mask)
        out = hidden + attn._out(o)
        return out + layer.mlp(layer.post_attention_layernorm(out))

    def logits(self, out):
        return self.lm_head(self.norm(out))  # [b, n, h] -> [b, n, dv]

    def placeholder_hidden(self, n: int) -> torch.Tensor:
        return self.fc(self.mask_hidden.to(self.fc.weight.dtype)).expand(1, n, -1)  # [1, 1, n*h] -> [1, n, h]

    # ------------------------------------------------------------------ training
    def cod_anchors(self, valid: torch.Tensor, generator=None) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """COD sampling. valid [b, n] bool (pairs that may anchor a chain) -> per depth d = 1..K-1:
        anchors [b, m_d] and ok [b, m_d]; depth d's anchors are a random subset of depth d-1's."""
        b, n = valid.shape
        r, r_min = self.cfg.down_sample_ratio, self.cfg.down_sample_ratio_min
        counts = valid.sum(1)  # [b]
        pool = valid
        out = []
        for d in range(1, self.cfg.num_depths):
            m = int((counts.float() * max(r**d, r_min)).floor().max())
            if m <= 0:
                break
            scores = torch.rand(b, n, generator=generator).to(valid.device).masked_fill(~pool, 2.0)
            keep = (counts.float() * max(r**d, r_min)).floor().long()  # [b] this row's quota
            picked = scores.topk(m, dim=1, largest=False).indices  # [b, m] in random order
            ok = pool.gather(1, picked) & (torch.arange(m, device=valid.device)[None] < keep[:, None])
            picked, order = picked.sort(1)  # back to causal order
            ok = ok.gather(1, order)
            out.append((picked, ok))
            pool = torch.zeros_like(pool).scatter(1, picked, ok)
        return out

    def forward_loss(self, batch) -> StepOutput:
        """P-EAGLE training, numbered:

        1. depth 0: every pair j = (fc(h_j), x_{j+1}) at position j, target x_{j+2};
        2. COD: depth d keeps a shrinking random subset of depth d-1's anchors a; element (a, d) reads
           (mask_token_id, fc(mask_hidden)) at position a + d, target x_{a+d+2};
        3. one forward over all elements: real pairs causally, each chain its own depths <= d;
        4. forward KL(p || q) against the target's distribution, summed over loss tokens (caller normalises).
        """
        ids = batch["input_ids"]
        b, s = ids.shape
        n = s - 1
        dev = ids.device
        m = (batch["loss_mask"] * batch["attention_mask"]).float()
        m = torch.cat([m, m.new_zeros(b, self.cfg.num_depths + 1)], dim=1)  # no label past the end
        hidden = self.fc(batch["aux_hidden_states"][:, :n].to(self.fc.weight.dtype))  # 1. [b, s-1, n*h] -> [b, n, h]
        anchor = [torch.arange(n, device=dev).expand(b, n)]
        depth = [torch.zeros(b, n, dtype=torch.long, device=dev)]
        ok = [batch["attention_mask"][:, 1:].bool()]
        gen = None if self.training else torch.Generator().manual_seed(0)
        for d, (a, a_ok) in enumerate(self.cod_anchors(m[:, 2 : 2 + n].bool(), gen), start=1):  # 2.
            anchor.append(a)
            depth.append(torch.full_like(a, d))
            ok.append(a_ok)
        anchor, depth, ok = torch.cat(anchor, 1), torch.cat(depth, 1), torch.cat(ok, 1)  # [b, Q]
        Q = anchor.shape[1]
        tokens = torch.where(depth == 0, ids[:, 1:].gather(1, anchor.clamp(max=n - 1)), self.mask_token_id)
        feats = torch.where((depth == 0)[..., None], hidden.gather(1, anchor[..., None].expand(-1, -1, hidden.shape[-1])),
                            self.placeholder_hidden(Q))  # [b, Q, h]
        same = anchor[:, :, None] == anchor[:, None, :]
        attend = ((depth[:, None, :] == 0) & (anchor[:, None, :] <= anchor[:, :, None])) \
            | (same & (depth[:, None, :] <= depth[:, :, None]))
        attend = (attend & ok[:, None, :]) | torch.eye(Q, dtype=torch.bool, device=dev)  # [b, Q, Q]
        if self.cfg.sliding_window is not None:  # keys less than sliding_window positions back (as the cache's)
            pos = anchor + depth  # [b, Q]
            attend = attend & ((pos[:, :, None] - pos[:, None, :]) < self.cfg.sliding_window)
        out = self.run(tokens, feats, anchor + depth, mask=attend[:, None])  # 3. [b, Q, h]
        logq = torch.log_softmax(self.logits(out).float(), dim=-1)  # [b, Q, dv]
        label_pos = anchor + depth + 1  # target position whose next token is x_{a+d+2}
        # restricted to the draft vocabulary before any fp32 copy: [b, s, V] -> [b, Q, dv] fp32, [b, Q] target ids
        p, top = vocab_loss.gathered_soft_labels(batch["target_logits"], label_pos.clamp(max=s - 1), self.draft_ids())
        mask = m.gather(1, label_pos + 1) * ok * (label_pos < s)  # loss token x_{a+d+2}
        kl = (p * (torch.log(p.clamp_min(1e-20)) - logq)).sum(-1)  # 4. [b, Q]
        # metrics per depth: regroup as [b, 1, Q] slots by depth
        per_depth = {}
        for d in range(self.cfg.num_depths):
            sel = (depth == d).float() * mask
            if d == 0 or sel.sum() > 0:
                per_depth[d] = sel
        metrics = {}
        with torch.no_grad():
            hit = (self.draft_ids()[logq.argmax(-1)] == top).float()
            for d, sel in per_depth.items():
                denom = sel.sum().clamp_min(1.0)
                metrics[f"acc_{d}"] = float((hit * sel).sum() / denom)
                metrics[f"loss_{d}"] = float((kl * sel).sum() / denom)
        return StepOutput(loss=(kl * mask).sum(), metrics=metrics, num_tokens=int(mask.sum()))

    # ------------------------------------------------------------------ inference
    def make_proposer(self, target) -> "PEagleProposer":
        return PEagleProposer(self, target)

    def state_dict_for_export(self) -> dict[str, torch.Tensor]:
        return dict(self.state_dict())  # the embedding is the drafter's own (trained) copy


class PEagleProposer:
    """commit() runs the new real pairs through the layer on the drafter's KV cache (as EAGLE-3);
    propose() drafts position 0 from the newest pair's output and positions 1..k-1 from k-1
    placeholders in ONE forward, then the cache is cropped back to the committed pairs."""

    name = "peagle"

    def __init__(self, drafter: PEagleDrafter, target):
        self.drafter = drafter
        self.vocab_size = target.vocab_size
        self.draft_ids = drafter.draft_ids()

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.cache = KVCache()
        self.committed = 0
        self.last_out: torch.Tensor | None = None  # [1, 1, h]

    @torch.no_grad()
    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        d = self.drafter
        self.cache.crop(self.committed)
        aux = torch.cat([target_out.hidden_states[i] for i in d.aux_layer_ids], dim=-1)  # [1, m, n*h]
        hidden = d.fc(aux.to(d.fc.weight.dtype))  # [1, m, n*h] -> [1, m, h]
        tokens = context[-num_new:].view(1, -1).to(hidden.device)
        positions = torch.arange(self.committed, self.committed + num_new, device=hidden.device).view(1, -1)
        out = d.run(tokens, hidden, positions, cache=self.cache)
        self.committed += num_new
        self.last_out = out[:, -1:]

    def parallel_logits(self, k: int) -> torch.Tensor:
        """-> [k, dv]: depth 0 from the newest committed pair, depths 1..k-1 from placeholders."""
        d = self.drafter
        outs = [self.last_out]
        if k > 1:
            dev = self.last_out.device
            tokens = torch.full((1, k - 1), d.mask_token_id, dtype=torch.long, device=dev)
            pos = torch.arange(self.committed, self.committed + k - 1, device=dev).view(1, -1)  # anchor + d
            outs.append(d.run(tokens, d.placeholder_hidden(k - 1), pos, cache=self.cache))
            self.cache.crop(self.committed)
        return d.logits(torch.cat(outs, dim=1))[0]

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling, generator=None) -> Draft:
        k = min(k, self.drafter.cfg.num_depths)
        logits = self.parallel_logits(k)
        q = logits_to_probs(on_target_vocab(logits.float(), self.draft_ids, self.vocab_size), sampling)  # [k, V]: each depth's own marginal
        tokens = q.argmax(-1) if sampling.greedy else sample(q, generator)
        return Draft(tokens=tokens, probs=q)
