"""benchmarks/bench_levers.py --text-agreement: how far a cache's answers stand from its target's greedy path."""
from __future__ import annotations

import statistics

import torch

from tests.helpers import load_repo_module


def row(tokens: list[int], answer_from: int, argmax: list[int]) -> dict:
    """A cache item: the text, its loss mask (answer positions from answer_from) and top-2 ids whose first is
    the target's argmax at each position."""
    ids = torch.tensor(tokens)
    mask = (torch.arange(len(tokens)) >= answer_from).long()
    top = torch.stack([torch.tensor(argmax), torch.tensor(argmax) + 1], dim=-1)
    return {"input_ids": ids, "loss_mask": mask, "label_topk_ids": top}


def test_text_agreement_counts_answer_positions_and_where_each_answer_leaves_the_greedy_path():
    bench = load_repo_module("benchmarks/bench_levers.py")
    on_path = row([5, 6, 7, 8, 9], 2, [9, 7, 8, 9, 0])  # prompt 5 6; answer 7 8 9, each the argmax before it
    leaves = row([5, 6, 7, 8, 9], 2, [6, 7, 3, 9, 0])  # argmax at position 2 is 3, the text says 8
    prompt_differs = row([5, 6, 7, 8, 9], 3, [1, 1, 1, 9, 0])  # disagreements before the answer do not count
    report = bench.text_agreement([on_path, leaves, prompt_differs])
    assert report["answer_tokens"] == 3 + 3 + 2
    assert report["argmax_agreement"] == (3 + 2 + 1) / 8
    assert report["rows"] == 3 and report["rows_on_the_greedy_path"] == 1
    assert bench.text_agreement([leaves])["first_departure_quartiles"] == [1]  # the answer's second token
    assert bench.text_agreement([prompt_differs])["first_departure_quartiles"] == [0]
    assert bench.text_agreement([on_path])["first_departure_quartiles"] == []
    late = row([5, 6, 7, 8, 9, 4, 4], 2, [9, 7, 8, 9, 1, 1, 0])  # leaves at its fourth answer token (index 3)
    assert bench.text_agreement([leaves, prompt_differs, late])["first_departure_quartiles"] == \
        statistics.quantiles([1, 0, 3], n=4)
    no_answer = row([5, 6, 7], 3, [6, 7, 0])  # loss mask all zero: neither on the path nor off it
    report = bench.text_agreement([on_path, no_answer])
    assert (report["rows"], report["rows_without_answer"], report["rows_on_the_greedy_path"]) == (1, 1, 1)
