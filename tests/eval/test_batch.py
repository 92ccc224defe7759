"""Batched decoding (loop.BatchState, eval/batch.py): greedy output per row identical to batch-1
target-only output, with ragged acceptance, different prompt lengths and rows finishing early."""
from __future__ import annotations

import copy

import pytest
import torch

from draftsmith.eval import batch as batch_mod
from draftsmith.eval.loop import LoopConfig, generate, generate_batch
from draftsmith.heads import draft_lm as draft_lm_mod
from draftsmith.testing import tiny_target


@pytest.fixture(scope="module")
def setup():
    t = tiny_target(num_layers=2, hidden=32, vocab=128, seed=4)
    prompts = [torch.tensor([1, 5, 9, 30]), torch.tensor([1, 70]), torch.tensor([1, 3, 4, 5, 6, 7, 8, 100]),
               torch.tensor([1, 44, 45])]
    return t, prompts


def test_repack_keeps_each_rows_entries_right_aligned():
    from transformers import DynamicCache, LlamaConfig

    cache = DynamicCache(config=LlamaConfig(num_hidden_layers=1))
    vals = torch.arange(2 * 5, dtype=torch.float).view(2, 1, 5, 1)  # 2 rows, 3 old + 2 new entries
    cache.update(vals, vals.clone(), 0)
    valid = torch.tensor([[False, True, True], [True, True, True]])
    new_valid = batch_mod.repack(cache, valid, [2, 0])
    assert new_valid.tolist() == [[True, True, True, True], [False, True, True, True]]
    assert cache.layers[0].keys[0, 0, :, 0].tolist() == [1, 2, 3, 4]  # old 1, 2 + both new
    assert cache.layers[0].keys[1, 0, 1:, 0].tolist() == [5, 6, 7]  # old entries only


@pytest.mark.parametrize("drafter", ["none", "self", "truncated"])
def test_batched_greedy_equals_batch1_target_only(setup, drafter):
    t, prompts = setup
    base = [generate(t, None, p, LoopConfig(k=0, max_new_tokens=20, eos_ids=[])).tokens for p in prompts]
    if drafter == "none":
        props, k = [None] * len(prompts), 0
    else:
        model = t.model if drafter == "self" else draft_lm_mod.layer_truncated_copy(t.model, 1)
        props, k = [draft_lm_mod.DraftModelProposer(model, t.vocab_size) for _ in prompts], 3
    # one EOS id per test: whatever row 1 emits 5th, so that row stops early while others go on
    eos = [base[1][4]] if drafter != "self" else []
    ref = [generate(t, None, p, LoopConfig(k=0, max_new_tokens=20, eos_ids=eos)).tokens for p in prompts]
    gens = generate_batch(t, props, prompts, LoopConfig(k=k, max_new_tokens=20, eos_ids=eos))
    assert [g.tokens for g in gens] == ref
    assert len({len(g.tokens) for g in gens}) > 1 or drafter == "self"  # ragged lengths: rows left the batch
    if drafter == "truncated":  # ragged acceptance inside one round
        per_round = list(zip(*[[r.accepted for r in g.rounds] for g in gens]))
        assert any(len(set(r)) > 1 for r in per_round)


def test_stories_batched_speculative_equals_target_only(stories_target):
    t = stories_target
    texts = ["Once upon a time", "Tom and Lily went to the park. They saw", "The little dog was sad because"]
    prompts = [t.tokenizer(x, return_tensors="pt").input_ids[0] for x in texts]
    base = [generate(t, None, p, LoopConfig(k=0, max_new_tokens=24)).tokens for p in prompts]
    dl = draft_lm_mod.DraftModelProposer(draft_lm_mod.layer_truncated_copy(t.model, 2), t.vocab_size)
    gens = generate_batch(t, [copy.copy(dl) for _ in prompts], prompts, LoopConfig(k=4, max_new_tokens=24))
    assert [g.tokens for g in gens] == base
