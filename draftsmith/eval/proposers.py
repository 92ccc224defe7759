"""Proposers the speculative loop drives (the Proposer protocol of heads/base.py).

- draft_lm: any Hugging Face causal LM sharing the target's tokenizer, with its own KV cache
            (heads/draft_lm.py: DraftModelProposer, beside the trained draft LM).
- ngram:    prompt lookup decoding (Saxena 2023): copy what followed the latest n-gram's
            earlier occurrence in the context; no model.
- replay:   benchmarks only: proposes a known continuation (the target's own greedy output)
            and misses at a controlled rate, to measure the loop against its physical bound.
- trained drafters (eagle3, ...): `drafter.make_proposer(target)`, see `from_drafter`.
- ngram_first: a trained drafter behind prompt lookup (`draftsmith eval CKPT --ngram-first`):
            the lookup drafts when it finds a match, the drafter only when it does not.

PROPOSERS maps a name to a builder `(target, **options) -> Proposer`; later kinds register here.
"""
from __future__ import annotations

import copy
from collections import Counter
from typing import Callable

import torch

from draftsmith.core.errors import UserError
from draftsmith.core.registry import Registry
from draftsmith.core.sampling import SamplingParams
from draftsmith.heads.base import Draft
from draftsmith.heads.draft_lm import DraftModelProposer, check_same_tokenizer
from draftsmith.targets.load import Target, TargetOutput

PROPOSERS: Registry[Callable] = Registry("proposer")


def _empty_draft(device) -> Draft:
    return Draft(tokens=torch.empty(0, dtype=torch.long, device=device))


class NgramProposer:
    """Prompt lookup decoding (Saxena 2023, "Prompt Lookup Decoding"); the same rule as HF's
    prompt_lookup_num_tokens with max_matching_ngram_size = max_ngram. Steps:
    1. for n = max_ngram down to min_ngram: take the context's last n tokens;
    2. find their earlier occurrences (not the tail itself); take the first one (match="first",
       as HF does) or the most recent (match="last");
    3. propose up to k tokens that followed it. No match at any n: an empty draft (a plain decode round).
    """

    name = "ngram"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1, match: str = "first"):
        if not 1 <= min_ngram <= max_ngram:
            raise UserError(f"ngram sizes need 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
        if match not in ("first", "last"):
            raise UserError(f"ngram match must be 'first' or 'last', got {match!r}")
        self.max_ngram, self.min_ngram, self.match = max_ngram, min_ngram, match

    def begin(self, prompt_ids: torch.Tensor) -> None:
        pass

    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        pass

    def propose(self, context: torch.Tensor, k: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        length = context.shape[0]
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            windows = context.unfold(0, n, 1)[:-1]  # [length - n, n]: every n-gram but the tail itself
            hits = (windows == context[-n:]).all(-1).nonzero().flatten()  # [h] start positions
            if hits.numel():
                start = int(hits[0 if self.match == "first" else -1].item()) + n
                return Draft(tokens=context[start:start + k].clone())  # probs None: q one-hot
        return _empty_draft(context.device)


class NgramFirstProposer:
    """Prompt lookup first, a trained drafter where the lookup has nothing (`draftsmith eval CKPT --ngram-first`).

    On a target whose output copies its context (a base model's greedy answers), the lookup is free and
    usually right when it matches, while a drafter costs a forward per draft token. So every round asks
    `ngram` first (matches of at least its min_ngram tokens); only a round where it finds none is drafted
    by `drafter`. Each round's draft comes whole from one of the two, with that one's q (one-hot for the
    lookup), so greedy and stochastic verification stay exact.

    The drafter's commits are deferred while the lookup drafts: the target states of those rounds are
    kept (hidden states only, copied out of the verification output so a batched run's [B, q, h] tensors
    are freed; no commit reads logits) and fed to the drafter in ONE commit, merged along the positions,
    the next time it drafts, or after max_pending deferred rounds (a bound on what is held; a merged
    commit equals the rounds' commits one by one). Most rounds the lookup drafts cost no drafter time.
    `rounds` counts the rounds each side drafted; copies (one per request of a batched run) share it.
    drafter_k caps the drafter's rounds below the loop's k (`--drafter-k`): a copy is right for many
    tokens running, a drafter's later positions rarely, and a lookup draft costs nothing however long.
    Chain drafting only: trees need one proposer's ranked candidates.
    """

    def __init__(self, ngram: NgramProposer, drafter, rounds: Counter | None = None, max_pending: int = 16,
                 drafter_k: int | None = None):
        if drafter_k is not None and drafter_k < 1:
            raise UserError(f"drafter_k must be >= 1, got {drafter_k}")
        self.ngram, self.drafter, self.max_pending, self.drafter_k = ngram, drafter, max_pending, drafter_k
        self.name = f"ngram_first+{getattr(drafter, 'name', type(drafter).__name__)}"
        self.rounds = rounds if rounds is not None else Counter()  # "ngram" / "drafter" -> rounds drafted
        self.pending: list[tuple[int, tuple[torch.Tensor, ...]]] = []  # (num_new, hidden states) not yet committed

    def __copy__(self) -> "NgramFirstProposer":
        return NgramFirstProposer(copy.copy(self.ngram), copy.copy(self.drafter), self.rounds, self.max_pending,
                                  self.drafter_k)

    def begin(self, prompt_ids: torch.Tensor) -> None:
        self.drafter.begin(prompt_ids)
        self.pending = []

    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        self.pending.append((num_new, tuple(h.clone() for h in target_out.hidden_states)))
        if len(self.pending) >= self.max_pending:
            self._catch_up(context)

    def _catch_up(self, context: torch.Tensor) -> None:
        """One drafter commit over every position committed since it last drafted."""
        if not self.pending:
            return
        num_new = sum(n for n, _ in self.pending)
        # per layer: [1, m_1, h] ... [1, m_r, h] -> [1, num_new, h]
        hidden = tuple(torch.cat(layer, dim=1) for layer in zip(*(h for _, h in self.pending)))
        self.pending = []
        self.drafter.commit(context, num_new, TargetOutput(logits=None, hidden_states=hidden))

    def propose(self, context: torch.Tensor, k: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        draft = self.ngram.propose(context, k, sampling, generator)
        if draft.tokens.numel():
            self.rounds["ngram"] += 1
            return draft
        self.rounds["drafter"] += 1
        self._catch_up(context)
        return self.drafter.propose(context, min(k, self.drafter_k or k), sampling, generator)


class ReplayProposer:
    """Proposes a known continuation (benchmarks: the target's own greedy output), replacing
    each proposed token with a wrong one with probability miss_rate."""

    name = "replay"

    def __init__(self, references: dict[tuple[int, ...], list[int]], vocab_size: int, miss_rate: float = 0.0,
                 seed: int = 0):
        self.references = references  # prompt ids -> prompt ids + continuation
        self.vocab_size, self.miss_rate = vocab_size, miss_rate
        self.rng = torch.Generator().manual_seed(seed)
        self.reference: list[int] = []

    def begin(self, prompt_ids: torch.Tensor) -> None:
        key = tuple(prompt_ids.tolist())
        if key not in self.references:
            raise KeyError("ReplayProposer has no reference continuation for this prompt; run k=0 first")
        self.reference = self.references[key]

    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        pass

    def propose(self, context: torch.Tensor, k: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        pos = context.shape[0]
        ref = torch.tensor(self.reference[pos:pos + k], dtype=torch.long)  # [<= k]
        miss = torch.rand(ref.shape[0], generator=self.rng) < self.miss_rate  # [<= k]
        ref = torch.where(miss, (ref + 1) % self.vocab_size, ref)
        return Draft(tokens=ref.to(context.device))


# ---------------------------------------------------------------- registry / factory
@PROPOSERS.register("draft_lm")
def build_draft_lm(target: Target, draft_model: str | Target | None = None, dtype: str | None = None,
                   **_) -> DraftModelProposer:
    """draft_model: a local dir, HF id, builtin:NAME or an already loaded Target."""
    from draftsmith.targets import load as target_mod

    if draft_model is None:
        raise UserError("the draft_lm proposer needs --draft-model DIR_OR_ID")
    if not isinstance(draft_model, Target):
        dtype = dtype or str(target.dtype).removeprefix("torch.")
        draft_model = target_mod.load(draft_model, dtype=dtype, device=str(target.device))
    check_same_tokenizer(target, draft_model)
    return DraftModelProposer(draft_model.model, target.vocab_size, name=f"draft_lm:{draft_model.name}")


@PROPOSERS.register("ngram")
def build_ngram(target: Target, max_ngram: int = 3, min_ngram: int = 1, match: str = "first", **_) -> NgramProposer:
    return NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram, match=match)


def from_drafter(drafter, target: Target, ngram_first: dict | None = None, drafter_k: int | None = None):
    """A trained drafter (heads/: eagle3, ...) as a proposer: the drafter builds it itself. With
    ngram_first (NgramProposer options: max_ngram, min_ngram, match) it drafts behind prompt lookup,
    at most drafter_k tokens in its own rounds (None: the loop's k)."""
    drafter.eval()
    proposer = drafter.make_proposer(target)
    if ngram_first is not None:
        proposer = NgramFirstProposer(NgramProposer(**ngram_first), proposer, drafter_k=drafter_k)
    return proposer


def build(kind: str, target: Target, **options):
    """`kind` from PROPOSERS ("draft_lm", "ngram", ...) -> a Proposer for `target`."""
    return PROPOSERS.get(kind)(target, **options)
