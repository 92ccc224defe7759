"""The one speculative decoding loop (batch size 1): prefill, then rounds of draft -> verify ->
commit, until one of the target's EOS ids or exactly max_new_tokens new tokens.

One round (DESIGN.md "Definitions"; Leviathan et al. 2023, Chen et al. 2023):
  1. draft   proposer.propose(context, k) -> k draft tokens d1..dk (+ their q for sampling)
  2. verify  ONE target forward over [last, d1..dk] (k+1 positions) on the target's KV cache,
             which holds every committed token but the last one
  3. accept  eval.sampling.verify: a accepted drafts + one correction/bonus token t
  4. rollback the target cache is cropped to the accepted prefix (cache.crop), never recomputed
  5. commit  context += d1..da, t; proposer.commit(context, a + 1, target output at those positions)
k = 0 skips steps 1 and 5: plain target-only decoding through the same code (the speedup baseline).
A proposer may return fewer than k drafts: that round's verify length (a block drafter's block size,
DSpark's confidence head, n-gram misses). RoundStats.proposed records it; results carry it per round.

Timing: draft = steps 1 + 5, verify = step 2, overhead = everything else in the round
(verification arithmetic, cache crop, bookkeeping); measured with time.perf_counter, after
torch.cuda.synchronize() when the target is on a GPU.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from draftsmith.eval.sampling import SamplingParams, logits_to_probs, sample, verify
from draftsmith.target import Target, TargetOutput


@dataclass
class LoopConfig:
    k: int = 5  # draft tokens per round; 0 = target-only decoding (the baseline)
    max_new_tokens: int = 128  # generation stops at exactly this many new tokens
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_ids: Optional[list[int]] = None  # None: the target's eos_ids (stories260K: [2, 1])


@dataclass
class RoundStats:
    proposed: int  # draft tokens sent to verification this round (<= k; fewer near the end or from n-gram)
    accepted: int  # draft tokens accepted by verification (0..proposed)
    committed: int  # tokens appended to the output (accepted + 1, fewer only if cut at an EOS)
    draft_s: float
    verify_s: float
    total_s: float

    @property
    def overhead_s(self) -> float:
        return self.total_s - self.draft_s - self.verify_s


@dataclass
class Generation:
    prompt_ids: list[int]
    tokens: list[int]  # the new tokens, EOS included when generation stopped at one
    stop: str  # "eos" | "length"
    ttft_s: float  # prefill forward + first token
    latency_s: float  # end to end: prefill, drafter prefill, every round
    rounds: list[RoundStats] = field(default_factory=list)
    k: int = 0


def _clock(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def rollback(cache, keep: int) -> None:
    """Drop cache entries past the first `keep` tokens (transformers 5: crop(-n) removes the last n)."""
    extra = cache.get_seq_length() - keep
    if extra < 0:
        raise ValueError(f"cannot roll the cache back to {keep} tokens: it holds only {keep + extra}")
    if extra:
        cache.crop(-extra)


def slice_output(out: TargetOutput, n: int) -> TargetOutput:
    """The first n positions of a batch-1 target output."""
    return TargetOutput(out.logits[:, :n], tuple(h[:, :n] for h in out.hidden_states))


class SpeculativeState:
    """One request in flight: the target's KV cache, the committed context and the round log.

    Tests drive it round by round (`prefill`, `step`) to inspect the cache after a rejection;
    `generate` below runs it to the end.
    """

    def __init__(self, target: Target, proposer, cfg: LoopConfig, generator: torch.Generator | None = None):
        from transformers import DynamicCache

        if cfg.k < 0:
            raise ValueError(f"k must be >= 0, got {cfg.k}")
        if cfg.k > 0 and proposer is None:
            raise ValueError("k > 0 needs a proposer (pass k=0 for target-only decoding)")
        self.target, self.proposer, self.cfg, self.generator = target, proposer, cfg, generator
        self.device = target.device
        self.eos = set(cfg.eos_ids if cfg.eos_ids is not None else target.eos_ids)
        self.cache = DynamicCache(config=target.config)
        self.context = torch.empty(0, dtype=torch.long, device=self.device)  # [N] committed ids
        self.new_tokens: list[int] = []
        self.rounds: list[RoundStats] = []
        self.stop: Optional[str] = None
        self.ttft_s = 0.0

    @property
    def done(self) -> bool:
        return self.stop is not None

    def _first_token(self, logits: torch.Tensor) -> int:
        if self.cfg.sampling.greedy:
            return int(logits.argmax(-1).item())
        return int(sample(logits_to_probs(logits, self.cfg.sampling), self.generator).item())

    def _append(self, tokens: list[int]) -> int:
        """Append new tokens, cut at the first EOS and at max_new_tokens; returns how many were kept."""
        kept = 0
        for tok in tokens:
            self.new_tokens.append(tok)
            kept += 1
            if tok in self.eos:
                self.stop = "eos"
                break
            if len(self.new_tokens) >= self.cfg.max_new_tokens:
                self.stop = "length"
                break
        ids = torch.tensor(tokens[:kept], dtype=torch.long, device=self.device)
        self.context = torch.cat([self.context, ids])  # [N] -> [N + kept]
        return kept

    def prefill(self, prompt_ids: torch.Tensor) -> None:
        """Target forward over the prompt, first token, then the proposer's own prefill."""
        prompt_ids = prompt_ids.to(self.device).long().reshape(-1)
        limit = getattr(self.target.config, "max_position_embeddings", None)
        n = prompt_ids.shape[0]
        if limit is not None and n + self.cfg.max_new_tokens > limit:
            raise ValueError(f"prompt ({n} tokens) + max_new_tokens ({self.cfg.max_new_tokens}) exceeds the target's "
                             f"max_position_embeddings ({limit}); shorten the prompt or lower --max-new-tokens")
        if self.cfg.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")
        start = _clock(self.device)
        out = self.target.forward(prompt_ids[None], cache=self.cache)  # [1, n] -> logits [1, n, V]
        first = self._first_token(out.logits[0, -1])
        self.ttft_s = _clock(self.device) - start
        self.context = prompt_ids
        self._append([first])
        if self.proposer is not None and self.cfg.k > 0 and not self.done:
            self.proposer.begin(prompt_ids)
            # position j of the prefill output predicts context[j + 1]: n positions, the last predicting `first`
            self.proposer.commit(self.context, n, out)

    def step(self) -> RoundStats:
        """One round: draft, one verification forward, accept, roll back, commit."""
        cfg, dev = self.cfg, self.device
        n_ctx = self.context.shape[0]
        remaining = cfg.max_new_tokens - len(self.new_tokens)
        k_round = min(cfg.k, remaining - 1)  # a round commits <= k_round + 1 tokens: never past max_new_tokens
        t0 = _clock(dev)
        draft_tokens = torch.empty(0, dtype=torch.long, device=dev)
        draft_probs = None
        if k_round > 0:  # 1. draft
            draft = self.proposer.propose(self.context, k_round, cfg.sampling, self.generator)
            draft_tokens = draft.tokens.to(dev).long().reshape(-1)[:k_round]
            draft_probs = None if draft.probs is None else draft.probs[: draft_tokens.shape[0]]
        proposed = draft_tokens.shape[0]
        t1 = _clock(dev)
        inputs = torch.cat([self.context[-1:], draft_tokens])[None]  # [1, proposed + 1]
        out = self.target.forward(inputs, cache=self.cache)  # 2. verify: logits [1, proposed + 1, V]
        t2 = _clock(dev)
        verdict = verify(draft_tokens, draft_probs, out.logits[0], cfg.sampling, self.generator)  # 3. accept
        a = verdict.accepted
        rollback(self.cache, n_ctx + a)  # 4. keep context[:-1] + last + d1..da
        committed = self._append(draft_tokens[:a].tolist() + [verdict.token])
        t3 = _clock(dev)
        if k_round > 0 and not self.done:  # 5. commit (positions 0..a: tokens d1..da, t)
            self.proposer.commit(self.context, a + 1, slice_output(out, a + 1))
        t4 = _clock(dev)
        stats = RoundStats(proposed, a, committed, draft_s=(t1 - t0) + (t4 - t3), verify_s=t2 - t1, total_s=t4 - t0)
        self.rounds.append(stats)
        return stats


def generate(target: Target, proposer, prompt_ids: torch.Tensor, cfg: LoopConfig,
             generator: torch.Generator | None = None) -> Generation:
    """Run one request to its end (an EOS id or exactly cfg.max_new_tokens new tokens)."""
    state = SpeculativeState(target, proposer, cfg, generator)
    start = _clock(state.device)
    state.prefill(prompt_ids)
    while not state.done:
        state.step()
    latency = _clock(state.device) - start
    return Generation(prompt_ids=prompt_ids.reshape(-1).tolist(), tokens=list(state.new_tokens), stop=state.stop, ttft_s=state.ttft_s, latency_s=latency,
                      rounds=state.rounds, k=cfg.k)
