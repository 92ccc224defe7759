"""The loop on the real stories260K target (fp32): lossless greedy output for every drafter
kind, cache rollback, identical drafter -> alpha 1.0, T=1 stochastic first token ~ p."""
from __future__ import annotations

import copy

import pytest
import torch
from test_verification import chi_square_pvalue

from draftsmith.core.sampling import SamplingParams, logits_to_probs, sample, verify_stochastic
from draftsmith.eval import proposers
from draftsmith.eval.loop import LoopConfig, SpeculativeState, generate
from draftsmith.heads import draft_lm as draft_lm_mod

PROMPTS = ["Once upon a time", "Tom and Lily went to the park. They saw", "The little dog was sad because"]
MAX_NEW = 48


@pytest.fixture(scope="module")
def prompts(stories_target):
    return [stories_target.tokenizer(p, return_tensors="pt").input_ids[0] for p in PROMPTS]


@pytest.fixture(scope="module")
def baseline(stories_target, prompts):
    return [generate(stories_target, None, ids, LoopConfig(k=0, max_new_tokens=MAX_NEW)).tokens for ids in prompts]


def _eagle3(target):
    from draftsmith.heads import DRAFTERS

    cls = DRAFTERS.get("eagle3")
    torch.manual_seed(0)
    return proposers.from_drafter(cls.from_target(cls.Config(), target), target)


def _make(kind, target):
    if kind == "draft_lm_2layer":
        return draft_lm_mod.DraftModelProposer(draft_lm_mod.layer_truncated_copy(target.model, 2), target.vocab_size)
    if kind == "draft_lm_same":
        return proposers.build("draft_lm", target, draft_model=target)
    if kind == "ngram":
        return proposers.build("ngram", target)
    return _eagle3(target)


def test_k0_matches_hf_generate(stories_target, prompts, baseline):
    for ids, ours in zip(prompts, baseline):
        ref = stories_target.model.generate(ids[None], max_new_tokens=MAX_NEW, do_sample=False)[0, ids.shape[0]:]
        assert ours == ref.tolist()


@pytest.mark.parametrize("kind", ["draft_lm_2layer", "draft_lm_same", "ngram", "eagle3"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_target_only(stories_target, prompts, baseline, kind, k):
    proposer = _make(kind, stories_target)
    for ids, ref in zip(prompts, baseline):
        g = generate(stories_target, proposer, ids, LoopConfig(k=k, max_new_tokens=MAX_NEW))
        assert g.tokens == ref, f"{kind} k={k} diverged on {ids.tolist()}"


def test_identical_drafter_accepts_everything(stories_target, prompts):
    proposer = _make("draft_lm_same", stories_target)
    g = generate(stories_target, proposer, prompts[0], LoopConfig(k=4, max_new_tokens=MAX_NEW))
    assert sum(r.proposed for r in g.rounds) > 0
    assert sum(r.accepted for r in g.rounds) == sum(r.proposed for r in g.rounds)  # alpha = 1.0


def test_cache_rollback_equals_fresh_forward(stories_target, prompts):
    proposer = _make("draft_lm_2layer", stories_target)
    state = SpeculativeState(stories_target, proposer, LoopConfig(k=4, max_new_tokens=MAX_NEW))
    state.prefill(prompts[1])
    rejections = 0
    while not state.done:
        r = state.step()
        n = state.context.shape[0]
        assert state.cache.get_seq_length() == n - 1  # every committed token but the newest
        if r.accepted < r.proposed and not state.done:
            rejections += 1
            probe = copy.deepcopy(state.cache)
            cached = stories_target.forward(state.context[-1:][None], cache=probe).logits[0, -1]
            fresh = stories_target.forward(state.context[None]).logits[0, -1]
            torch.testing.assert_close(cached, fresh, rtol=1e-5, atol=1e-5)
    assert rejections >= 2, "the 2-layer draft should be rejected in some rounds"


def test_stochastic_first_token_on_stories(stories_target, prompts):
    """T = 1: the first speculative token, drafted by the 2-layer copy and verified, is ~ p."""
    params = SamplingParams(temperature=1.0)
    ids = prompts[0]
    draft = draft_lm_mod.layer_truncated_copy(stories_target.model, 2)
    p = logits_to_probs(stories_target.forward(ids[None]).logits[0, -1], params)  # [V]
    q = logits_to_probs(draft(input_ids=ids[None]).logits[0, -1].detach(), params)  # [V]
    assert (p - q).abs().sum() > 0.1, "p and q should differ for the test to mean something"
    gen = torch.Generator().manual_seed(0)
    n = 4000
    counts = torch.zeros_like(p)
    targets = torch.stack([p, p])
    for _ in range(n):
        d = sample(q, gen).view(1)
        v = verify_stochastic(d, q[None], targets, gen)
        counts[d.item() if v.accepted else v.token] += 1
    assert chi_square_pvalue(counts, p) > 1e-3
    assert chi_square_pvalue(torch.bincount(sample(q.expand(n, -1), gen), minlength=p.numel()), p) < 1e-6


def _in_target_top_k(target, prompt, tokens, top_k) -> list[bool]:
    """Whether each generated token lies in the target's top-k at its position (p's support)."""
    full = torch.cat([prompt, torch.tensor(tokens)])
    logits = target.forward(full[None]).logits[0]  # [n, V]
    top = torch.topk(logits[prompt.shape[0] - 1: -1], top_k, dim=-1).indices  # [new, top_k]
    return [tok in row.tolist() for tok, row in zip(tokens, top)]


@pytest.mark.parametrize("kind", ["draft_lm_same", "draft_lm_2layer"])
def test_stochastic_loop_stays_in_the_support_of_p(stories_target, prompts, kind):
    """T = 1, top-k 20: every committed token (accepted draft, correction or bonus) lies in the
    target's top-20, where p > 0; a drafter identical to the target is never rejected (p/q = 1)."""
    proposer = _make(kind, stories_target)
    cfg = LoopConfig(k=3, max_new_tokens=MAX_NEW, sampling=SamplingParams(1.0, top_k=20))
    accepted = proposed = 0
    for seed, ids in enumerate(prompts):
        g = generate(stories_target, proposer, ids, cfg, torch.Generator().manual_seed(seed))
        assert all(_in_target_top_k(stories_target, ids, g.tokens, 20)), f"{kind}: a token outside p's support"
        accepted += sum(r.accepted for r in g.rounds)
        proposed += sum(r.proposed for r in g.rounds)
    if kind == "draft_lm_same":
        assert accepted == proposed > 0
    else:
        assert 0 < accepted < proposed


@pytest.mark.parametrize("kind", ["draft_lm_2layer", "eagle3"])
def test_greedy_tree_decoding_equals_target_only(stories_target, prompts, baseline, kind):
    from draftsmith.eval.tree import TreeConfig

    proposer = _make(kind, stories_target)
    cfg = LoopConfig(k=4, max_new_tokens=MAX_NEW, tree=TreeConfig("dynamic", depth=4, topk=3, budget=8))
    for ids, ref in zip(prompts, baseline):
        assert generate(stories_target, proposer, ids, cfg).tokens == ref, f"{kind} tree diverged on {ids.tolist()}"
