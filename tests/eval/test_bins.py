"""Acceptance by context and output position (eval/bins.py) and the long_context workload."""
from __future__ import annotations

from draftsmith.eval import bins, workloads
from draftsmith.eval.loop import Generation, RoundStats

try:
    from tests.conftest import shared_path
except ImportError:  # pytest run from inside tests/
    from conftest import shared_path


def _gen(prompt_len, committed):
    rounds = [RoundStats(proposed=3, accepted=c - 1, committed=c, draft_s=0, verify_s=0, total_s=0) for c in committed]
    return Generation(prompt_ids=[0] * prompt_len, tokens=[0] * (1 + sum(committed)), stop="length", ttft_s=0,
                      latency_s=1, rounds=rounds)


def test_round_records_and_bins():
    g = _gen(60, [4, 4, 1, 2])  # rounds start at output positions 1, 5, 9, 10
    recs = bins.round_records(g)
    assert [r[0] for r in recs] == [1, 5, 9, 10] and [r[1] for r in recs] == [61, 65, 69, 70]
    by_ctx = bins.binned(recs, 1)
    assert [(b["lo"], b["hi"], b["rounds"]) for b in by_ctx] == [(32, 64, 1), (64, 128, 3)]
    assert by_ctx[1]["acceptance_length"] == (4 + 1 + 2) / 3 and by_ctx[1]["acceptance_rate"] == 4 / 9
    agg = bins.aggregate([{"prompt_tokens": 60, "_rounds": recs}, {"prompt_tokens": 300, "_rounds": bins.round_records(_gen(300, [2]))}])
    assert [(b["lo"], b["requests"], b["acceptance_length"]) for b in agg["by_prompt_length"]] == [(32, 1, 11 / 4), (256, 1, 2.0)]
    assert agg["by_output_position"][0] == {"lo": 0, "hi": 32, "rounds": 5, "acceptance_length": 13 / 5,
                                            "acceptance_rate": 8 / 15}


def test_long_context_workload_covers_every_length_first():
    shared_path("data", "pretrain_text", "wiki_demo.txt")
    n = len(workloads.LONG_CONTEXT_CHARS)
    items = workloads.load("long_context", None, n)
    assert [i["category"] for i in items] == [f"prefix-{c}" for c in workloads.LONG_CONTEXT_CHARS]
    base = items[0]["prompt"]
    assert all(i["prompt"].endswith(base) for i in items)
    assert [len(i["prompt"]) - len(base) for i in items[1:]] == [c + 2 for c in workloads.LONG_CONTEXT_CHARS[1:]]
