"""The one speculative decoding loop (batch size 1): prefill, then rounds of draft -> verify ->
commit, until one of the target's EOS ids or exactly max_new_tokens new tokens.

One round (docs/design.md "Definitions"; Leviathan et al. 2023, Chen et al. 2023):
  1. draft   proposer.propose(context, k) -> k draft tokens d1..dk (+ their q for sampling)
  2. verify  ONE target forward over [last, d1..dk] (k+1 positions) on the target's KV cache,
             which holds every committed token but the last one
  3. accept  sampling.verify: a accepted drafts + one correction/bonus token t
  4. rollback the target cache is cropped to the accepted prefix (cache.crop), never recomputed; a hybrid
             target's recurrent / conv layers restore the state kept at the accepted position
             (LoopConfig.state_rollback "keep"), or their snapshot plus a replay of the accepted
             tokens ("replay"); targets/state_cache.py. Trees and batches refuse hybrid targets.
  5. commit  context += d1..da, t; proposer.commit(context, a + 1, target output at those positions)
k = 0 skips steps 1 and 5: plain target-only decoding through the same code (the speedup baseline).
BatchState runs B requests through the same round together (eval/batch.py: one batched verification
forward, ragged per-row acceptance, per-row rollback by gather). With LoopConfig.tree set, step 1
drafts a tree and steps 2-4 verify it in one forward with a tree attention mask, accept a path and
gather that path's cache entries (eval/tree.py).
A proposer may return fewer than k drafts: that round's verify length (a block drafter's block size,
DSpark's confidence head, n-gram misses). RoundStats.proposed records it; results carry it per round.

Timing: draft = steps 1 + 5, verify = step 2, overhead = everything else in the round
(verification arithmetic, cache crop, bookkeeping); measured with time.perf_counter on CPU, and
with CUDA events on a GPU (recorded on the stream, read once the round's last event completed:
one wait per round instead of a device synchronisation at every time stamp).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample, verify
from draftsmith.eval import batch as batch_mod
from draftsmith.eval import tree as tree_mod
from draftsmith.targets import state_cache
from draftsmith.targets.archs import text_config
from draftsmith.targets.load import Target, TargetOutput


@dataclass
class LoopConfig:
    k: int = 5  # draft tokens per round; 0 = target-only decoding (the baseline)
    max_new_tokens: int = 128  # generation stops at exactly this many new tokens
    sampling: SamplingParams = field(default_factory=SamplingParams)
    eos_ids: Optional[list[int]] = None  # None: the target's eos_ids (stories260K: [2, 1])
    tree: Optional[tree_mod.TreeConfig] = None  # tree drafting (k then only gates the proposer: set it >= 1)
    # Keep the target's top-2 logits behind every new token (Generation.top2): --check-lossless asks for
    # them to tell a numerical near-tie from a real mismatch (eval/numerics.py).
    record_top2: bool = False
    # Hybrid targets (recurrent / conv layers): "keep" the state at each verified position, or snapshot and
    # "replay" the accepted tokens after a rejection (targets/state_cache.py; benchmarks/bench_hybrid_rollback.py).
    state_rollback: str = "keep"


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
    top2: Optional[list] = None  # LoopConfig.record_top2: per new token (top-1 logit, top-2 logit, top-1 id, top-2 id)
    logits_dtype: Optional[torch.dtype] = None  # the dtype of the logits those came from


class _EventStamp:
    """A CUDA event recorded on the current stream; `later - earlier` is the seconds between them,
    waiting only for `later` to complete (no device-wide synchronisation)."""

    def __init__(self, device: torch.device) -> None:
        self.event = torch.cuda.Event(enable_timing=True)
        self.event.record(torch.cuda.current_stream(device))

    def __sub__(self, earlier: "_EventStamp") -> float:
        self.event.synchronize()
        return earlier.event.elapsed_time(self.event) / 1e3  # ms -> s


def clock(device: torch.device):
    """A time stamp: seconds from time.perf_counter on CPU, a CUDA event on a GPU; subtract two."""
    if device.type == "cuda":
        return _EventStamp(device)
    return time.perf_counter()


def rollback(cache, keep: int) -> None:
    """Drop cache entries past the first `keep` tokens (transformers 5: crop(-n) removes the last n).
    A hybrid cache's recurrent layers take the state kept at position `keep`; with nothing to drop,
    their recorded states and conv windows are released (state_cache.trim)."""
    extra = state_cache.seq_length(cache) - keep
    if extra < 0:
        raise ValueError(f"cannot roll the cache back to {keep} tokens: it holds only {keep + extra}")
    if extra:
        cache.crop(-extra)
    else:
        state_cache.trim(cache)


def slice_output(out: TargetOutput, n: int) -> TargetOutput:
    """The first n positions of a batch-1 target output."""
    return TargetOutput(out.logits[:, :n], tuple(h[:, :n] for h in out.hidden_states))


class SpeculativeState:
    """One request in flight: the target's KV cache, the committed context and the round log.

    Tests drive it round by round (`prefill`, `step`) to inspect the cache after a rejection;
    `generate` below runs it to the end.
    """

    def __init__(self, target: Target, proposer, cfg: LoopConfig, generator: torch.Generator | None = None):
        from draftsmith.targets.archs import new_cache

        if cfg.k < 0:
            raise UserError(f"k must be >= 0, got {cfg.k}")
        if cfg.k > 0 and proposer is None:
            raise UserError("k > 0 needs a proposer (pass k=0 for target-only decoding)")
        if cfg.state_rollback not in state_cache.ROLLBACK_MODES:
            raise UserError(f"state_rollback {cfg.state_rollback!r} is not one of {list(state_cache.ROLLBACK_MODES)}")
        if cfg.tree is not None and (why := state_cache.loop_refusal(target.config, "tree drafting")):
            raise UserError(why)
        self.target, self.proposer, self.cfg, self.generator = target, proposer, cfg, generator
        self.device = target.device
        self.eos = set(cfg.eos_ids if cfg.eos_ids is not None else target.eos_ids)
        # sliding-window layers record their past, recurrent layers keep k + 1 states: rollback works
        self.cache = new_cache(target.config, keep_states=cfg.k + 1, state_rollback=cfg.state_rollback)
        self.replay = cfg.state_rollback == "replay" and state_cache.has_state_layers(target.config)
        self.context = torch.empty(0, dtype=torch.long, device=self.device)  # [N] committed ids
        self.new_tokens: list[int] = []
        self.rounds: list[RoundStats] = []
        self.stop: Optional[str] = None
        self.ttft_s = 0.0
        self.top2: Optional[list] = [] if cfg.record_top2 else None
        self.logits_dtype: Optional[torch.dtype] = None

    def _record_top2(self, logits: torch.Tensor, kept: int) -> None:
        """logits [n, V]: the rows behind the `kept` tokens just appended (LoopConfig.record_top2)."""
        if self.top2 is None:
            return
        values, ids = logits[:kept].float().topk(2, dim=-1)  # [kept, 2] each
        self.top2 += [(v[0], v[1], i[0], i[1]) for v, i in zip(values.tolist(), ids.tolist())]
        self.logits_dtype = logits.dtype

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

    def prefill(self, prompt_ids: torch.Tensor, media: dict | None = None) -> None:
        """Target forward over the prompt, first token, then the proposer's own prefill. media: a
        vision-language target's image inputs for the prompt (pixel_values, token_type_ids from its
        processor); the vision tower runs in this forward only, decoding continues on the cache."""
        prompt_ids = prompt_ids.to(self.device).long().reshape(-1)
        limit = getattr(text_config(self.target.config), "max_position_embeddings", None)  # a VLM: its language model's
        n = prompt_ids.shape[0]
        if limit is not None and n + self.cfg.max_new_tokens > limit:
            raise UserError(f"prompt ({n} tokens) + max_new_tokens ({self.cfg.max_new_tokens}) exceeds the target's "
                             f"max_position_embeddings ({limit}); shorten the prompt or lower --max-new-tokens")
        if self.cfg.max_new_tokens < 1:
            raise UserError("max_new_tokens must be >= 1")
        start = clock(self.device)
        media = {k: v.to(self.device) for k, v in (media or {}).items()}
        out = self.target.forward(prompt_ids[None], cache=self.cache, **media)  # [1, n] -> logits [1, n, V]
        rollback(self.cache, n)  # nothing to drop: releases the states a hybrid cache recorded
        first = self._first_token(out.logits[0, -1])
        self.ttft_s = clock(self.device) - start
        self.context = prompt_ids
        self._record_top2(out.logits[0, -1:], self._append([first]))
        if self.proposer is not None and self.cfg.k > 0 and not self.done:
            self.proposer.begin(prompt_ids)
            # position j of the prefill output predicts context[j + 1]: n positions, the last predicting `first`
            self.proposer.commit(self.context, n, out)

    def step(self) -> RoundStats:
        """One round: draft, one verification forward, accept, roll back, commit."""
        if self.cfg.tree is not None:
            return self._step_tree()
        cfg, dev = self.cfg, self.device
        n_ctx = self.context.shape[0]
        remaining = cfg.max_new_tokens - len(self.new_tokens)
        k_round = min(cfg.k, remaining - 1)  # a round commits <= k_round + 1 tokens: never past max_new_tokens
        t0 = clock(dev)
        draft_tokens = torch.empty(0, dtype=torch.long, device=dev)
        draft_probs = None
        if k_round > 0:  # 1. draft
            draft = self.proposer.propose(self.context, k_round, cfg.sampling, self.generator)
            draft_tokens = draft.tokens.to(dev).long().reshape(-1)[:k_round]
            draft_probs = None if draft.probs is None else draft.probs[: draft_tokens.shape[0]]
        proposed = draft_tokens.shape[0]
        t1 = clock(dev)
        inputs = torch.cat([self.context[-1:], draft_tokens])[None]  # [1, proposed + 1]
        snap = state_cache.snapshot(self.cache) if self.replay else None  # hybrid, "replay": states before verify
        out = self.target.forward(inputs, cache=self.cache)  # 2. verify: logits [1, proposed + 1, V]
        t2 = clock(dev)
        verdict = verify(draft_tokens, draft_probs, out.logits[0], cfg.sampling, self.generator)  # 3. accept
        a = verdict.accepted
        if snap is not None and a < proposed:  # 4. (replay) states and keys back to n_ctx - 1, then last + d1..da again
            state_cache.restore(self.cache, snap, proposed + 1)
            self.target.forward(inputs[:, : a + 1], cache=self.cache)  # [1, a + 1]
        else:
            rollback(self.cache, n_ctx + a)  # 4. keep context[:-1] + last + d1..da
        committed = self._append(draft_tokens[:a].tolist() + [verdict.token])
        self._record_top2(out.logits[0], committed)
        t3 = clock(dev)
        if k_round > 0 and not self.done:  # 5. commit (positions 0..a: tokens d1..da, t)
            self.proposer.commit(self.context, a + 1, slice_output(out, a + 1))
        t4 = clock(dev)
        stats = RoundStats(proposed, a, committed, draft_s=(t1 - t0) + (t4 - t3), verify_s=t2 - t1, total_s=t4 - t0)
        self.rounds.append(stats)
        return stats

    def _step_tree(self) -> RoundStats:
        """One tree round: the same five steps, with a tree where the chain was (eval/tree.py)."""
        cfg, dev = self.cfg, self.device
        n_past = self.context.shape[0] - 1  # the cache holds every committed token but the last
        depth = min(cfg.tree.depth, cfg.max_new_tokens - len(self.new_tokens) - 1)
        t0 = clock(dev)
        empty = torch.empty(0, dtype=torch.long, device=dev)
        tree = tree_mod.build(self.proposer, cfg.tree, depth) if depth > 0 else tree_mod.Tree.chain(empty)  # 1.
        tree = tree_mod.Tree(tree.tokens.to(dev), tree.parents.to(dev), tree.depths.to(dev))
        t1 = clock(dev)
        mask, positions = tree_mod.verify_inputs(tree, n_past, self.target.dtype)  # [1, 1, N+1, n_past+N+1], [1, N+1]
        positions = positions + self.target.position_offset()  # after an image prompt: Qwen-VL's M-RoPE shift
        inputs = torch.cat([self.context[-1:], tree.tokens])[None]  # [1, N + 1]
        out = self.target.forward(inputs, attention_mask=mask, cache=self.cache, position_ids=positions)  # 2.
        t2 = clock(dev)
        verdict = tree_mod.verify_tree(tree, out.logits[0], cfg.sampling, self.generator)  # 3.
        keep = tree_mod.keep_indices(verdict.path, n_past, dev)  # [n_past + 1 + a]
        tree_mod.gather_cache(self.cache, keep)  # 4. gather, not crop
        a = len(verdict.path)
        committed = self._append(tree.tokens[verdict.path].tolist() + [verdict.token])
        rows = keep[n_past:] - n_past  # [a + 1]: the root and the accepted nodes
        if self.top2 is not None:  # only --check-lossless's rerun: the gather copies [a + 1, V] logits
            self._record_top2(out.logits[0, rows], committed)
        t3 = clock(dev)
        if depth > 0 and not self.done:  # 5. the target's outputs at the root and the accepted nodes
            self.proposer.commit(self.context, a + 1, TargetOutput(out.logits[:, rows], tuple(h[:, rows] for h in out.hidden_states)))
        t4 = clock(dev)
        stats = RoundStats(len(tree), a, committed, draft_s=(t1 - t0) + (t4 - t3), verify_s=t2 - t1, total_s=t4 - t0)
        self.rounds.append(stats)
        return stats


def generate(target: Target, proposer, prompt_ids: torch.Tensor, cfg: LoopConfig,
             generator: torch.Generator | None = None, media: dict | None = None) -> Generation:
    """Run one request to its end (an EOS id or exactly cfg.max_new_tokens new tokens); media: image
    inputs of a vision-language target's prompt (SpeculativeState.prefill)."""
    state = SpeculativeState(target, proposer, cfg, generator)
    start = clock(state.device)
    state.prefill(prompt_ids, media)
    while not state.done:
        state.step()
    latency = clock(state.device) - start
    return Generation(prompt_ids=prompt_ids.reshape(-1).tolist(), tokens=list(state.new_tokens), stop=state.stop, ttft_s=state.ttft_s, latency_s=latency,
                      rounds=state.rounds, k=cfg.k, top2=state.top2, logits_dtype=state.logits_dtype)


class BatchState:
    """B requests decoding together: per-request prefill (batch 1, exactly as `generate`), then rounds
    in which each row drafts with its own proposer, ONE target forward verifies every row's
    [last, d1..dk] (rows padded to the longest draft), and each row accepts its own number of tokens
    (ragged); eval/batch.py keeps the per-row cache lengths. Finished rows leave the batch.
    Chain drafting only (trees are batch 1); drafting runs row by row (not batched)."""

    def __init__(self, target: Target, proposers: list, cfg: LoopConfig, generators: list | None = None):
        if cfg.tree is not None:
            raise UserError("batched decoding drafts chains only: drop --tree or use --batch-size 1")
        if len(proposers) > 1 and (why := state_cache.loop_refusal(target.config, "batched decoding")):
            raise UserError(why)
        generators = generators or [None] * len(proposers)
        self.target, self.cfg = target, cfg
        self.rows = [SpeculativeState(target, p, cfg, g) for p, g in zip(proposers, generators)]
        self.finished_s: list[float] = [0.0] * len(self.rows)  # clock at which each row stopped

    def prefill(self, prompts: list[torch.Tensor]) -> None:
        for row, ids in zip(self.rows, prompts):
            row.prefill(ids)
        self.start = clock(self.target.device)
        self.cache, self.valid = batch_mod.stack_caches([r.cache for r in self.rows], self.target.config)
        for row in self.rows:
            row.cache = None  # the batched cache holds every row's entries now
        self.active = list(range(len(self.rows)))
        self._drop_finished()

    @property
    def done(self) -> bool:
        return not self.active

    def _drop_finished(self) -> None:
        now = clock(self.target.device)
        keep = [j for j, i in enumerate(self.active) if not self.rows[i].done]
        for i in self.active:
            if self.rows[i].done:
                self.finished_s[i] = now
        if len(keep) < len(self.active) and keep:
            self.valid = batch_mod.select_rows(self.cache, self.valid, torch.tensor(keep, device=self.valid.device))
        self.active = [self.active[j] for j in keep]

    def step(self) -> None:
        """One batched round: 1. draft per row, 2. one verification forward [B, q], 3. accept per row,
        4. per-row rollback by gather (repack), 5. commit per row."""
        cfg, dev = self.cfg, self.target.device
        live = [self.rows[i] for i in self.active]
        t0 = clock(dev)
        drafts, draft_s = [], []
        for row in live:  # 1.
            t = clock(dev)
            k_round = min(cfg.k, cfg.max_new_tokens - len(row.new_tokens) - 1)
            tokens, probs = torch.empty(0, dtype=torch.long, device=dev), None
            if k_round > 0:
                d = row.proposer.propose(row.context, k_round, cfg.sampling, row.generator)
                tokens = d.tokens.to(dev).long().reshape(-1)[:k_round]
                probs = None if d.probs is None else d.probs[: tokens.shape[0]]
            drafts.append((tokens, probs))
            draft_s.append(clock(dev) - t)
        t1 = clock(dev)
        q = 1 + max(t.shape[0] for t, _ in drafts)
        inputs = torch.zeros(len(live), q, dtype=torch.long, device=dev)  # [B, q], padded drafts are never kept
        for r, (row, (tokens, _)) in enumerate(zip(live, drafts)):
            inputs[r, : tokens.shape[0] + 1] = torch.cat([row.context[-1:], tokens])
        mask, positions = batch_mod.verify_inputs(self.valid, q, self.target.dtype)  # [B, 1, q, L + q], [B, q]
        out = self.target.forward(inputs, attention_mask=mask, cache=self.cache, position_ids=positions)  # 2.
        t2 = clock(dev)
        accepted = []
        for r, (row, (tokens, probs)) in enumerate(zip(live, drafts)):  # 3.
            n = tokens.shape[0]
            verdict = verify(tokens, probs, out.logits[r, : n + 1], cfg.sampling, row.generator)
            committed = row._append(tokens[: verdict.accepted].tolist() + [verdict.token])
            accepted.append((n, verdict.accepted, committed))
        self.valid = batch_mod.repack(self.cache, self.valid, [a + 1 for _, a, _ in accepted])  # 4.
        for r, (row, (n, a, _)) in enumerate(zip(live, accepted)):  # 5.
            tc = clock(dev)
            if n > 0 and not row.done:
                row.proposer.commit(row.context, a + 1, TargetOutput(out.logits[r:r + 1, : a + 1],
                                                                     tuple(h[r:r + 1, : a + 1] for h in out.hidden_states)))
            draft_s[r] += clock(dev) - tc
        t4 = clock(dev)
        for row, (n, a, committed), ds in zip(live, accepted, draft_s):
            row.rounds.append(RoundStats(n, a, committed, draft_s=ds, verify_s=t2 - t1, total_s=t4 - t0))
        self._drop_finished()


def generate_batch(target: Target, proposers: list, prompts: list[torch.Tensor], cfg: LoopConfig,
                   generators: list | None = None) -> list[Generation]:
    """Run len(prompts) requests together to their ends; one proposer per request (None for k = 0).
    A request's latency runs from the start of the batch (after the prefills) plus its own prefill."""
    state = BatchState(target, proposers, cfg, generators)
    state.prefill(prompts)
    while not state.done:
        state.step()
    return [Generation(prompt_ids=ids.reshape(-1).tolist(), tokens=list(row.new_tokens), stop=row.stop,
                       ttft_s=row.ttft_s, latency_s=row.ttft_s + (state.finished_s[i] - state.start),
                       rounds=row.rounds, k=cfg.k) for i, (row, ids) in enumerate(zip(state.rows, prompts))]
