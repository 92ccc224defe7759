"""Proposers the speculative loop drives (the Proposer protocol of heads/base.py).

- draft_lm: any Hugging Face causal LM sharing the target's tokenizer, with its own KV cache.
- ngram:    prompt lookup decoding (Saxena 2023): copy what followed the latest n-gram's
            earlier occurrence in the context; no model.
- replay:   benchmarks only: proposes a known continuation (the target's own greedy output)
            and misses at a controlled rate, to measure the loop against its physical bound.
- trained drafters (eagle3, ...): `drafter.make_proposer(target)`, see `from_drafter`.

PROPOSERS maps a name to a builder `(target, **options) -> Proposer`; later kinds register here.
"""
from __future__ import annotations

from typing import Callable

import torch

from draftsmith.eval.sampling import SamplingParams, logits_to_probs, sample
from draftsmith.heads.base import Draft
from draftsmith.registry import Registry
from draftsmith.target import Target

PROPOSERS: Registry[Callable] = Registry("proposer")


def _empty_draft(device) -> Draft:
    return Draft(tokens=torch.empty(0, dtype=torch.long, device=device))


def fit_vocab(logits: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[..., V_draft] -> [..., V_target]: drop ids the target does not have, or pad with -inf
    (models that share a tokenizer often pad their embedding tables to different sizes)."""
    extra = logits.shape[-1] - vocab_size
    if extra > 0:
        return logits[..., :vocab_size]
    if extra < 0:
        pad = logits.new_full((*logits.shape[:-1], -extra), float("-inf"))
        return torch.cat([logits, pad], dim=-1)
    return logits


class DraftModelProposer:
    """A small causal LM drafts k tokens autoregressively (chain drafting) on its own KV cache.

    The cache holds a prefix of the committed context plus the drafts of the last round; commit()
    crops it to the longest prefix that agrees with the committed context, and propose() first
    feeds the committed tokens the cache lacks (at least the newest one).
    """

    name = "draft_lm"

    def __init__(self, model, target_vocab_size: int, name: str = "draft_lm"):
        self.model = model.eval()
        self.vocab_size = target_vocab_size
        self.name = name
        self.cache = None
        self._cached = torch.empty(0, dtype=torch.long)  # ids whose keys/values the cache holds

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def begin(self, prompt_ids: torch.Tensor) -> None:
        from draftsmith.archs import new_cache

        self.cache = new_cache(self.model.config)  # rollback works on sliding-window layers
        self._cached = torch.empty(0, dtype=torch.long, device=self.device)

    def commit(self, context: torch.Tensor, num_new: int, target_out) -> None:
        self._tree_context = context  # tree_root drafts after it
        n = min(self._cached.shape[0], context.shape[0] - 1)
        same = (self._cached[:n] == context[:n].to(self._cached.device)).long()  # [n]
        keep = int(same.cumprod(0).sum().item()) if n else 0
        extra = self.cache.get_seq_length() - keep
        if extra:
            self.cache.crop(-extra)
        self._cached = self._cached[:keep]

    @torch.no_grad()
    def propose(self, context: torch.Tensor, k: int, sampling: SamplingParams,
                generator: torch.Generator | None = None) -> Draft:
        context = context.to(self.device)
        feed = context[self._cached.shape[0]:]  # [m >= 1] committed ids not yet in the cache
        tokens, probs = [], []
        for _ in range(k):
            out = self.model(input_ids=feed[None], cache=self.cache, use_cache=True)  # [1, m] -> [1, m, V_d]
            logits = fit_vocab(out.logits[0, -1].float(), self.vocab_size)  # [V]
            if sampling.greedy:
                tok = logits.argmax(-1)
            else:
                q = logits_to_probs(logits, sampling)  # [V]
                tok = sample(q, generator)
                probs.append(q)
            tokens.append(tok)
            feed = tok.reshape(1)
        drafted = torch.stack(tokens)  # [k]
        # The cache now holds context + d1..d(k-1): dk was sampled but never fed.
        self._cached = torch.cat([context, drafted[:-1]])
        return Draft(tokens=drafted, probs=torch.stack(probs) if probs else None)  # probs [k, V]

    # ---- tree drafting (eval/tree.py): the draft LM's own tree attention through a 4D mask
    @torch.no_grad()
    def tree_root(self) -> torch.Tensor:
        from draftsmith.eval.tree import FedNodes

        context = self._tree_context.to(self.device)
        feed = context[self._cached.shape[0]:]  # [m >= 1] committed ids not yet in the cache
        out = self.model(input_ids=feed[None], cache=self.cache, use_cache=True)  # [1, m] -> [1, m, V_d]
        self._cached = context  # tree entries appended from here are dropped by the next commit()
        self.tree_fed = FedNodes(self.device)
        return torch.log_softmax(fit_vocab(out.logits[0, -1].float(), self.vocab_size), -1)  # [V]

    @torch.no_grad()
    def tree_expand(self, tokens: torch.Tensor, parents: torch.Tensor, depth: int) -> torch.Tensor:
        n = self._cached.shape[0]
        seen = self.tree_fed.add(parents.to(self.device), n)  # [m, n + F + m] True = attend
        dtype = next(self.model.parameters()).dtype
        mask = torch.zeros(seen.shape, dtype=dtype, device=self.device).masked_fill(~seen, torch.finfo(dtype).min)
        pos = torch.full((1, tokens.shape[0]), n + depth - 1, device=self.device)
        out = self.model(input_ids=tokens.view(1, -1).to(self.device), attention_mask=mask[None, None],
                         position_ids=pos, cache=self.cache, use_cache=True)  # [1, m] -> [1, m, V_d]
        return torch.log_softmax(fit_vocab(out.logits[0].float(), self.vocab_size), -1)  # [m, V]


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
            raise ValueError(f"ngram sizes need 1 <= min_ngram ({min_ngram}) <= max_ngram ({max_ngram})")
        if match not in ("first", "last"):
            raise ValueError(f"ngram match must be 'first' or 'last', got {match!r}")
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


def layer_truncated_copy(model, num_layers: int):
    """A draft LM made of the target's first num_layers decoder layers plus its embedding,
    final norm and lm_head (a self-speculative draft in the spirit of Draft & Verify, Zhang
    et al. 2024, and LayerSkip, Elhoushi et al. 2024). Shares no tensors with `model`."""
    import copy

    if not 1 <= num_layers <= model.config.num_hidden_layers:
        raise ValueError(f"num_layers must be in 1..{model.config.num_hidden_layers}, got {num_layers}")
    draft = copy.deepcopy(model)
    draft.model.layers = draft.model.layers[:num_layers]
    draft.config.num_hidden_layers = num_layers
    if getattr(draft.config, "layer_types", None):
        draft.config.layer_types = draft.config.layer_types[:num_layers]
    return draft.eval()


# ---------------------------------------------------------------- registry / factory
def check_same_tokenizer(target: Target, draft: Target) -> None:
    if target.tokenizer.get_vocab() != draft.tokenizer.get_vocab():
        raise ValueError(f"draft model {draft.name!r} does not share the tokenizer of target {target.name!r}; "
                         "a draft LM must use the target's tokenizer (same ids for the same tokens)")


@PROPOSERS.register("draft_lm")
def build_draft_lm(target: Target, draft_model: str | Target | None = None, dtype: str | None = None,
                   **_) -> DraftModelProposer:
    """draft_model: a local dir, HF id, builtin:NAME or an already loaded Target."""
    from draftsmith import target as target_mod

    if draft_model is None:
        raise ValueError("the draft_lm proposer needs --draft-model DIR_OR_ID")
    if not isinstance(draft_model, Target):
        dtype = dtype or str(target.dtype).removeprefix("torch.")
        draft_model = target_mod.load(draft_model, dtype=dtype, device=str(target.device))
    check_same_tokenizer(target, draft_model)
    return DraftModelProposer(draft_model.model, target.vocab_size, name=f"draft_lm:{draft_model.name}")


@PROPOSERS.register("ngram")
def build_ngram(target: Target, max_ngram: int = 3, min_ngram: int = 1, match: str = "first", **_) -> NgramProposer:
    return NgramProposer(max_ngram=max_ngram, min_ngram=min_ngram, match=match)


def from_drafter(drafter, target: Target):
    """A trained drafter (heads/: eagle3, ...) as a proposer: the drafter builds it itself."""
    drafter.eval()
    return drafter.make_proposer(target)


def build(kind: str, target: Target, **options):
    """`kind` from PROPOSERS ("draft_lm", "ngram", ...) -> a Proposer for `target`."""
    return PROPOSERS.get(kind)(target, **options)
