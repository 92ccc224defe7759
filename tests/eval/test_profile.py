"""Speedup profile (eval/profile.py): the model's choices on synthetic costs, and `draftsmith profile`
-> speedup_profile.json -> `draftsmith export` copying it with the recommended k."""
from __future__ import annotations

import json
import statistics

from draftsmith.cli import main as cli_main
from draftsmith.eval import profile

try:
    from tests.conftest import REPO, STORIES, shared_path
except ImportError:  # pytest run from inside tests/
    from conftest import REPO, STORIES, shared_path


def _table(cost):
    return [{"context": c, "batch": B, "width": w, "seconds": cost(B, w, c)}
            for c in (64, 256) for B in (1, 4, 16) for w in range(1, 5)]


def _acc(a=0.8, draft=0.0):
    return {"per_position": [a, a, a], "draft_step_s": draft, "overhead_spec_s": 0.0, "overhead_target_s": 0.0}


def test_verify_cost_interpolates_context_only():
    t = _table(lambda B, w, c: B * w * c * 1e-6)
    assert profile.verify_cost(t, 4, 2, 64) == 4 * 2 * 64e-6
    assert abs(profile.verify_cost(t, 4, 2, 160) - 4 * 2 * 160e-6) < 1e-12
    assert profile.verify_cost(t, 4, 2, 1000) == 4 * 2 * 256e-6  # nearest measured context


def test_flat_verify_cost_speculates_everywhere():
    rec = profile.recommend(_acc(), _table(lambda B, w, c: 1e-3 * B), [1, 4, 16], 3, 64)
    assert [v["k"] for v in rec["best_k_by_batch"].values()] == [3, 3, 3]
    assert rec["speculation_stops_paying_at_batch"] is None
    p = profile.predict(_acc(), _table(lambda B, w, c: 1e-3 * B), 1, 3, 64)
    assert abs(p["speedup"] - (1 + 0.8 + 0.64 + 0.512)) < 1e-9  # free drafts and verify: speedup = E[tau]


def test_compute_bound_batches_stop_paying():
    """Verify cost flat up to 4 tokens in flight, then linear: batch 1 speculates, batch 16 does not."""
    rec = profile.recommend(_acc(draft=1e-5), _table(lambda B, w, c: 1e-3 * max(4, B * w)), [1, 4, 16], 3, 64)
    assert rec["best_k_by_batch"]["1"]["k"] == 3
    assert rec["best_k_by_batch"]["16"]["k"] == 0 and rec["speculation_stops_paying_at_batch"] == 4


def test_costly_drafts_do_not_pay_and_summary_says_so():
    acc = _acc(a=0.3, draft=5e-3)
    table = _table(lambda B, w, c: 1e-3 * B)
    rec = profile.recommend(acc, table, [1, 4], 3, 64)
    assert rec["speculation_stops_paying_at_batch"] == 1
    text = profile.summary({"recommendation": {"w": rec}, "speculation_pays_at_batch_1": False, "validation": [],
                            "validation_error": None})
    assert "speculation does not pay here" in text


def test_profile_cli_then_export_copies_it(tmp_path, monkeypatch):
    from draftsmith import checkpoint
    from draftsmith import config as config_mod
    from draftsmith.heads import DRAFTERS
    from draftsmith.targets import load as target_mod

    shared_path(STORIES)
    cfg = config_mod.load(str(REPO / "recipes" / "debug" / "eagle3-stories260k.yaml"))
    cfg.target.path = str(shared_path(STORIES))
    target = target_mod.from_config(cfg.target)
    drafter = DRAFTERS.get("eagle3").from_target(cfg.drafter.options, target, None)
    ckpt = tmp_path / "run" / "final"
    checkpoint.save(ckpt, drafter, target, cfg, step=0)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "a", "prompt": "Once upon a time"}\n{"id": "b", "prompt": "Lily saw a big"}\n')
    from draftsmith.eval import runner

    validated_formats = []
    run_batched = runner.run_batched

    def recording_run_batched(target, proposer, name, s, batch_sizes, **kw):
        validated_formats.append(s.prompt_format)
        return run_batched(target, proposer, name, s, batch_sizes, **kw)

    monkeypatch.setattr(runner, "run_batched", recording_run_batched)
    rc = cli_main(["profile", str(ckpt), "--workloads", f"jsonl:{prompts}", "--k-max", "2", "--batches", "1,2",
                   "--contexts", "16,32", "--repeats", "1", "--num-prompts", "2", "--max-new-tokens", "6",
                   "--overhead-batch", "2", "--validate-batches", "2"])
    assert rc == 0
    prof = json.loads((ckpt / profile.PROFILE_FILE).read_text())
    assert prof["schema"] == profile.SCHEMA
    assert prof["settings"]["prompt_format"] == "plain"  # as eval: the format the drafter trained on (Alpaca chat)
    assert validated_formats == ["plain"]  # the validation runs are prompted as the acceptance run was
    assert {(r["batch"], r["width"], r["context"]) for r in prof["verify_cost"]} == \
        {(B, w, c) for B in (1, 2) for w in (1, 2, 3) for c in (16, 32)}
    assert [c["batch"] for c in prof["validation"]] == [2] and prof["validation_error"]["mean_abs_relative"] >= 0
    acc = prof["acceptance"][f"jsonl:{prompts}"]  # rho, timed in the batch of --overhead-batch rows
    assert acc["batch_draft_ratio"] > 0
    rec = prof["recommended_num_speculative_tokens"]
    assert rec == prof["recommendation"][f"jsonl:{prompts}"]["best_k_by_batch"]["1"]["k"]
    out = tmp_path / "export"
    assert cli_main(["export", str(ckpt), "--to", "vllm", "--out", str(out)]) == 0
    assert (out / profile.PROFILE_FILE).read_text() == (ckpt / profile.PROFILE_FILE).read_text()
    side = json.loads((out / "draftsmith.json").read_text())
    assert side["speedup_profile"]["recommended_num_speculative_tokens"] == rec
    if rec >= 1:
        assert side["num_speculative_tokens"] == rec
    # the leaderboard plots the profile (and acceptance against context for results that carry it)
    from tests.report.result_files import make_result, workload

    res = make_result(workloads={"long_context": workload(2.0, [0.8, 0.5, 0.4])})
    res["workloads"]["long_context"]["aggregate"]["by_context"] = [
        {"lo": 64, "hi": 128, "rounds": 3, "acceptance_length": 2.2, "acceptance_rate": 0.4},
        {"lo": 256, "hi": 512, "rounds": 5, "acceptance_length": 1.6, "acceptance_rate": 0.2}]
    (tmp_path / "r.json").write_text(json.dumps(res))
    assert cli_main(["leaderboard", str(tmp_path / "r.json"), "--profile", str(ckpt / profile.PROFILE_FILE),
                     "--out", str(tmp_path / "lb")]) == 0
    names = [p.name for p in (tmp_path / "lb" / "plots").iterdir()]
    assert any("acceptance-vs-context" in n for n in names) and any(n.startswith("profile-1-") for n in names)
    assert "Speedup profiles" in (tmp_path / "lb" / "README.md").read_text()


def test_verify_cost_fit_ignores_preempted_samples():
    """Time-sliced forwards only ever cost MORE: the fit recovers the cost law from the rest."""
    true = lambda B, w, c: 2e-3 + 5e-5 * B * w + 1e-7 * B * w * c  # noqa: E731
    rows = [{"batch": B, "width": w, "context": c, "seconds_raw_min": true(B, w, c)}
            for c in (64, 256) for B in (1, 4, 16) for w in (1, 2, 3, 4)]
    for i in (3, 7, 12, 20):  # four samples caught a preemption: 5-12x slower
        rows[i]["seconds_raw_min"] *= 5 + i % 8
    a, b, e, f = profile.fit_verify_cost(rows)
    assert abs(a - 2e-3) < 1e-5 and abs(b - 5e-5) < 2e-6 and abs(e - 1e-7) < 1e-8 and f < 1e-6
    assert [r["fit_outlier"] for r in rows].count(True) == 4


def test_verify_cost_keeps_kernel_steps_and_repairs_spikes():
    """A real cost step (wider verification switching kernels: 4+ tokens cost 1.9x, at every context)
    stays in `seconds`; a time-sliced cell (one context only) is repaired from its context neighbour."""
    def true(B, w, c):
        return (0.10 if B * w < 4 else 0.19) + 1e-5 * B * w + 1e-7 * B * w * c

    rows = [{"batch": B, "width": w, "context": c, "seconds_raw_min": true(B, w, c)}
            for c in (64, 256) for B in (1, 4) for w in range(1, 7)]
    spiked = {(64, 1, 2): 6.0, (256, 4, 3): 8.0}  # (context, batch, width) -> slowdown
    for r in rows:
        r["seconds_raw_min"] *= spiked.get((r["context"], r["batch"], r["width"]), 1.0)
    profile.fit_verify_cost(rows)
    profile.cost_envelope(rows)
    for r in rows:
        want = true(r["batch"], r["width"], r["context"])
        tol = 0.05 if (r["context"], r["batch"], r["width"]) in spiked else 1e-9
        assert abs(r["seconds"] - want) <= tol * want, (r, want)
    # the smooth fit alone misses the step by far more than that: what made mt_bench's prediction 1.8x too high
    step = [r for r in rows if (r["context"], r["batch"], r["width"]) == (64, 1, 6)][0]
    assert step["seconds_fit"] < 0.9 * step["seconds"]
    assert profile.verify_cost(rows, 1, 6, 64) == step["seconds"]


def test_rows_after_the_first_draft_at_the_measured_ratio():
    """draft(B, k) = first row's cost * (1 + (B - 1) * rho); without rho every row costs a batch-1 round's
    drafting (rho = 1)."""
    acc = {**_acc(draft=2e-3), "draft_commit_s": 4e-3}  # one row's drafting at k = 3: 3 * 2 ms + 4 ms = 10 ms
    table = _table(lambda B, w, c: 1e-3 * B)
    tau = 1 + 0.8 + 0.64 + 0.512
    step, verify = 4e-3, 4e-3  # flat: T(4, w) = 4 ms at every width
    plain = profile.predict(acc, table, 4, 3, 64)["speedup"]
    assert abs(plain - tau * step / (verify + 4 * 10e-3)) < 1e-9
    warm = profile.predict({**acc, "batch_draft_ratio": 0.6}, table, 4, 3, 64)["speedup"]
    assert abs(warm - tau * step / (verify + 10e-3 * (1 + 3 * 0.6))) < 1e-9
    assert profile.predict({**acc, "batch_draft_ratio": 0.6}, table, 1, 3, 64)["speedup"] == \
        profile.predict(acc, table, 1, 3, 64)["speedup"]  # batch 1: one row, rho plays no part


def test_batch_draft_ratio_counts_full_rounds_that_commit():
    """rho = median over rounds of (mean drafting of rows 1..B-1) / row 0's, over rounds where every row drafted
    the deepest draft and drafts again (a row's last round skips its commit and is cheap; a cut draft too)."""
    from draftsmith.eval.loop import Generation, RoundStats

    def gen(draft_s, proposed):
        rounds = [RoundStats(p, 0, 1, draft_s=d, verify_s=0.1, total_s=0.2) for d, p in zip(draft_s, proposed)]
        return Generation(prompt_ids=[1], tokens=[2] * len(rounds), stop="length", ttft_s=0.0, latency_s=1.0,
                          rounds=rounds)

    gens = [gen([10, 10, 20, 10, 1], [3, 3, 3, 3, 3]),  # row 0: round 2 time-sliced
            gen([6, 7, 6, 1, 1], [3, 3, 3, 2, 3]),       # round 3 cut to 2 drafts: not counted
            gen([6, 5, 6, 6, 1], [3, 3, 3, 3, 3])]       # the last round (no commit after it): not counted
    assert profile.batch_draft_ratio(gens) == statistics.median([0.6, 0.6, 0.3])
    assert profile.batch_draft_ratio(gens[:1]) is None  # one row: nothing to compare
    assert profile.batch_draft_ratio([gen([10, 1], [0, 0]), gen([5, 1], [0, 0])]) is None  # nothing drafted
    short = [gen([10], [3]), gen([6], [3])]
    assert profile.batch_draft_ratio(short) is None  # only a last round
