"""Numbers that cannot mislead (issue 11, item 18): acceptance does not count drafts past an EOS,
stochastic acceptance is strict u < p/q, decode-only (TPOT) speedup, CUDA event timing, the median
of repeated timings per prompt and mode."""
from __future__ import annotations

import pytest
import torch
from eval_toys import fixed_logit_target, successor_table

from draftsmith.core.sampling import verify_stochastic
from draftsmith.eval import loop, metrics, runner
from draftsmith.eval.loop import Generation, LoopConfig, RoundStats, generate
from draftsmith.heads.draft_lm import DraftModelProposer

V = 16


def test_drafts_after_an_eos_are_not_counted():
    target = fixed_logit_target(successor_table(V))
    proposer = DraftModelProposer(fixed_logit_target(successor_table(V)).model, V)
    g = generate(target, proposer, torch.tensor([0]), LoopConfig(k=5, max_new_tokens=14, eos_ids=[3]))
    assert (g.rounds[0].proposed, g.rounds[0].accepted, g.rounds[0].committed) == (5, 5, 2)
    m = metrics.request_metrics(g, g, k=5)
    # drafts 2 and 3 (the EOS) count; drafts 4, 5, 6 after the EOS neither as proposed nor as accepted
    assert (m["proposed"], m["accepted"]) == (2, 2)
    assert m["reached_position"] == [1, 1, 0, 0, 0] and m["accepted_by_position"] == [1, 1, 0, 0, 0]
    agg = metrics.aggregate([{**m, "_costs": {}}], k=5)
    assert agg["acceptance_rate"] == 1.0 and agg["per_position_acceptance"][:2] == [1.0, 1.0]


def test_counted_keeps_uncut_rounds():
    assert metrics.counted(RoundStats(4, 2, 3, 0, 0, 0)) == (4, 2)  # rejection: correction token, no cut
    assert metrics.counted(RoundStats(4, 4, 5, 0, 0, 0)) == (4, 4)  # bonus token
    assert metrics.counted(RoundStats(4, 3, 1, 0, 0, 0)) == (1, 1)  # first draft was an EOS


def test_stochastic_acceptance_is_strict(monkeypatch):
    """u = 0 (which torch.rand can return) must not accept a token the target gives p = 0."""
    monkeypatch.setattr(torch, "rand", lambda *a, **kw: torch.zeros(a[0]))
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]])  # [k+1, V]: the target never says token 0
    q = torch.tensor([[1.0, 0.0, 0.0]])  # [k, V]: the draft is sure of token 0
    verdict = verify_stochastic(torch.tensor([0]), q, p)
    assert verdict.accepted == 0 and verdict.token == 1


def _gen(tokens: int, latency: float, ttft: float) -> Generation:
    return Generation(prompt_ids=[0], tokens=list(range(tokens)), stop="length", ttft_s=ttft, latency_s=latency,
                      rounds=[RoundStats(0, 0, 1, 0.0, 0.0, 0.0)] * (tokens - 1))


def test_tpot_speedup_beside_end_to_end():
    spec, base = _gen(11, latency=3.0, ttft=2.0), _gen(11, latency=4.0, ttft=1.0)
    m = metrics.request_metrics(spec, base, k=0)
    assert m["speedup"] == pytest.approx(4.0 / 3.0)  # end to end, the long prefill included
    assert m["tpot_s"] == pytest.approx(0.1) and m["target_tpot_s"] == pytest.approx(0.3)
    assert m["tpot_speedup"] == pytest.approx(3.0)  # decode only
    agg = metrics.aggregate([{**m, "_costs": {}}], k=0)
    assert agg["tpot_speedup"]["median"] == pytest.approx(3.0)


def test_pooled_tau_weighs_requests_by_rounds():
    short = {"committed": 2, "rounds": 1}  # tau 2.0 over 1 round
    long = {"committed": 10, "rounds": 10}  # tau 1.0 over 10 rounds
    reqs = []
    for r in (short, long):
        g = Generation([0], list(range(r["committed"] + 1)), "length", 0.1, 1.0,
                       [RoundStats(1, 1, 2, 0, 0, 0)] if r is short else [RoundStats(1, 0, 1, 0, 0, 0)] * 10)
        reqs.append({**metrics.request_metrics(g, g, k=1), "_costs": {}})
    tau = metrics.aggregate(reqs, k=1)["acceptance_length"]
    assert tau["mean"] == pytest.approx(1.5) and tau["pooled"] == pytest.approx(12 / 11)


def test_cuda_timing_uses_events_not_synchronize(monkeypatch):
    """On a GPU the loop records events and waits once for the later one; no device-wide sync."""
    clock = {"now": 0.0}

    class FakeEvent:
        def __init__(self, enable_timing):
            assert enable_timing
            self.t, self.waited = None, False

        def record(self, stream=None):
            self.t = clock["now"]

        def synchronize(self):
            self.waited = True

        def elapsed_time(self, end):
            assert end.waited, "the later event must complete before it is read"
            return (end.t - self.t) * 1e3  # ms

    def no_sync(*a, **kw):
        raise AssertionError("torch.cuda.synchronize called")

    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    dev = torch.device("cuda")
    t0 = loop.clock(dev)
    clock["now"] = 0.25
    t1 = loop.clock(dev)
    assert t1 - t0 == pytest.approx(0.25)


def test_each_prompt_is_timed_repeatedly_and_the_median_kept(monkeypatch):
    latencies = iter([5.0, 1.0, 3.0, 9.0, 2.0, 4.0])  # base, spec, base, spec, base, spec
    calls = []

    def fake_run(target, proposer, ids, k, s, sampling, seed, media=None):
        calls.append(k)
        return _gen(3, latency=next(latencies), ttft=0.1)

    monkeypatch.setattr(runner, "_run", fake_run)
    spec, base = runner._timed_pair(None, None, torch.tensor([0]), runner.EvalSettings(k=2, repeats=3), 0,
                                    base_first=True)
    assert calls == [0, 2, 0, 2, 0, 2]  # interleaved
    assert base.latency_s == 3.0 and spec.latency_s == 4.0  # medians of (5, 3, 2) and (1, 9, 4)


def test_eval_refuses_fewer_than_three_repeats(capsys):
    from draftsmith.cli import main

    assert main(["eval", "--target", "builtin:pycode-tiny", "--proposer", "ngram", "--workloads", "pycode",
                 "--repeats", "1"]) == 2
    assert "--repeats 1: must be >= 3" in capsys.readouterr().err
