"""Speculative-loop invariants with toy models of fixed logits (tests/eval/eval_toys.py)."""
from __future__ import annotations

import pytest
import torch
from eval_toys import fixed_logit_target, successor_table

from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.heads.draft_lm import DraftModelProposer

V = 16
PROMPT = torch.tensor([0])


def _proposer(table):
    return DraftModelProposer(fixed_logit_target(table).model, V)


def _run(target, proposer, k, max_new, eos=()):
    return generate(target, proposer, PROMPT, LoopConfig(k=k, max_new_tokens=max_new, eos_ids=list(eos)))


@pytest.fixture(scope="module")
def target():
    return fixed_logit_target(successor_table(V))


@pytest.mark.parametrize("k", [1, 3, 5])
def test_never_accept_gives_tau_1(target, k):
    wrong = successor_table(V, {x: (x + 2) % V for x in range(V)})  # always proposes x+2, target says x+1
    g = _run(target, _proposer(wrong), k, max_new=12)
    assert g.tokens == list(range(1, 13))  # still the target's own output
    assert all(r.accepted == 0 and r.committed == 1 for r in g.rounds)
    assert len(g.rounds) == 11  # the first token comes from the prefill


@pytest.mark.parametrize("k", [1, 3, 5])
def test_always_accept_gives_k_plus_1(target, k):
    g = _run(target, _proposer(successor_table(V)), k, max_new=1 + 3 * (k + 1))
    assert g.tokens == [(i % V) for i in range(1, 2 + 3 * (k + 1))]
    assert [(r.proposed, r.accepted, r.committed) for r in g.rounds] == [(k, k, k + 1)] * 3


def test_mixed_case_exact_sequence(target):
    # drafter agrees with the target except after token 3 (proposes 7 instead of 4)
    g = _run(target, _proposer(successor_table(V, {3: 7})), k=3, max_new=10)
    assert g.tokens == list(range(1, 11))
    # round 1 drafts 2,3,7: 2 accepted, correction 4; round 2 drafts 5,6,7 all accepted + bonus 8;
    # round 3 has room for 2 tokens only: k capped to 1, draft 9 accepted + bonus 10
    assert [(r.proposed, r.accepted, r.committed) for r in g.rounds] == [(3, 2, 3), (3, 3, 4), (1, 1, 2)]
    assert g.stop == "length"


def test_k0_is_target_only_decoding(target):
    g = _run(target, None, k=0, max_new=7)
    assert g.tokens == list(range(1, 8))
    assert all(r.proposed == 0 and r.committed == 1 for r in g.rounds) and len(g.rounds) == 6


@pytest.mark.parametrize("eos", [[5], [12, 5], [5, 1]])
@pytest.mark.parametrize("k", [0, 2, 4])
def test_stops_at_any_eos_in_the_list(target, eos, k):
    g = _run(target, _proposer(successor_table(V)) if k else None, k, max_new=14, eos=eos)
    assert g.tokens == [1, 2, 3, 4, 5] if 1 not in eos else g.tokens == [1]
    assert g.stop == "eos"


@pytest.mark.parametrize("k", [0, 1, 2, 5])
@pytest.mark.parametrize("max_new", [1, 2, 3, 6, 7, 13])
def test_max_new_tokens_exact(target, k, max_new):
    g = _run(target, _proposer(successor_table(V)) if k else None, k, max_new=max_new)
    assert len(g.tokens) == max_new and g.stop == "length"
    assert sum(r.committed for r in g.rounds) == max_new - 1


def test_eos_inside_accepted_drafts_cuts_the_round(target):
    g = _run(target, _proposer(successor_table(V)), k=5, max_new=14, eos=[3])
    assert g.tokens == [1, 2, 3]
    assert g.rounds[0].accepted == 5 and g.rounds[0].committed == 2  # drafts 2,3 kept, the rest cut at EOS 3
