"""Leaderboard rows and order, speed ranks per hardware, the written files, and both CLI commands."""
from __future__ import annotations

import json
import re

import numpy as np
import pytest
from matplotlib.image import imread
from result_files import HW_CPU, make_result, workload, write

from draftsmith.cli import main as cli_main
from draftsmith.report.leaderboard import build_rows, model_tables
from draftsmith.report.leaderboard_site import build_leaderboard
from draftsmith.report.results_io import load_results

EXPECTED_ORDER = [
    ("stories260K", "mt_bench", "eagle3-a", 2.0),
    ("stories260K", "mt_bench", "medusa-b", 1.6),
    ("stories260K", "spec_bench", "medusa-b", 2.8),
    ("stories260K", "spec_bench", "eagle3-a", 2.5),
    ("tiny-llama", "spec_bench", "ngram", 1.4),
]


def test_three_files_give_the_right_rows_in_the_right_order(three_results):
    results, skipped = load_results(three_results)
    rows = build_rows(results)
    assert skipped == []
    assert [(r.target, r.workload, r.drafter, r.acceptance_length) for r in rows] == EXPECTED_ORDER
    top = rows[2]
    assert (top.drafter_kind, top.k, top.temperature, top.hardware) == ("medusa", 3, 0.0, "cuda: NVIDIA H200")
    assert top.speedup == 2.5 and top.tokens_per_s == 250.0 and top.memory_mb == 512.0
    assert top.command == "draftsmith eval runs/medusa-b/final --workloads spec_bench,mt_bench --k 3"
    # The GPU row is far faster, but it is on other hardware: every row is rank 1 on its own machine.
    assert [r.speed_rank for r in rows] == [1, 1, 1, 1, 1]


def test_speed_is_ranked_within_one_hardware(tmp_path):
    files = [write(tmp_path / f"{n}.json", make_result(drafter=n, workloads={"w": workload(tau, [0.5] * 3, speedup=s)}))
             for n, tau, s in (("slow-good", 2.5, 1.1), ("fast-poor", 1.5, 1.6))]
    rows = build_rows(load_results(files)[0])
    assert [(r.drafter, r.speed_rank) for r in rows] == [("slow-good", 2), ("fast-poor", 1)]


def _nonblank(png) -> bool:
    img = imread(png)
    return img.shape[0] > 100 and float(np.var(img[..., :3])) > 1e-3


def test_build_writes_page_readme_plots_and_model(three_results, tmp_path):
    log = tmp_path / "run" / "metrics.jsonl"
    log.parent.mkdir()
    log.write_text("\n".join(json.dumps({"step": s, "loss": 3.0 / (s + 1), "lr": 1e-3, "acc_0": s / 20,
                                         "acc_1": s / 40, "tokens_per_s": 1000.0, "grad_norm": 1.0})
                             for s in range(10)), encoding="utf-8")
    out = build_leaderboard(three_results, tmp_path / "lb", training_logs=[str(log)], k_max=6)
    # the fixtures' costs do not fit their measured speedups: every such k is flagged, nothing else noted
    assert out.skipped == [] and all("prediction outside the measured spread" in n for n in out.notes)
    html = out.index_html.read_text(encoding="utf-8")
    assert "http://" not in html and "https://" not in html  # works offline: nothing fetched
    assert html.count("<tr data-row=") == 5
    readme = out.readme.read_text(encoding="utf-8")
    table_rows = [ln for ln in readme.splitlines() if re.match(r"\| \d+ \| (stories260K|tiny-llama) \|", ln)]
    assert [ln.split(" | ")[3] for ln in table_rows] == [d for _t, _w, d, _a in EXPECTED_ORDER]
    pngs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", readme)
    # per target: 2 acceptance pictures; per (target, hardware): speedup + model; one training curve
    assert len(pngs) == 2 * 2 + 3 * 2 + 1
    for rel in pngs:
        assert _nonblank(out.out_dir / rel), rel
    assert "../results/a.json" in readme  # each row links its result file
    # speedup model: eagle3-a on spec_bench, a = [0.9, 0.6, 0.4], costs 1 / 4 / 4 ms, overhead 4 * 0.1 / 0.6 ms
    t = next(t for s in out.sections for _p, ts in s.by_hardware.values() for t in ts
             if t.drafter == "eagle3-a" and t.workload == "spec_bench")
    tau3 = 1 + 0.9 + 0.9 * 0.6 + 0.9 * 0.6 * 0.4
    assert t.predictions[3].expected_tau == tau3
    assert abs(t.predictions[3].speedup - tau3 * 4 / (3 + 4 + 4 * 0.1 / 0.6)) < 1e-9
    assert t.measured[3].speedup == 1.3 and [p.k for p in t.predictions] == list(range(7))
    rows = json.loads(out.rows_json.read_text(encoding="utf-8"))
    assert [r["drafter"] for r in rows] == [d for _t, _w, d, _a in EXPECTED_ORDER]


def test_cli_leaderboard_skips_malformed_and_refuses_mixing(three_results, tmp_path, capsys):
    bad = tmp_path / "results" / "bad.json"
    bad.write_text("[]", encoding="utf-8")
    assert cli_main(["leaderboard", *map(str, three_results), str(bad), "--out", str(tmp_path / "lb")]) == 0
    captured = capsys.readouterr()
    assert f"skipped: {bad}: top level is list" in captured.err
    assert "5 rows from 3 files" in captured.out
    other = write(tmp_path / "v2.json", make_result(definitions="draftsmith-v2"))
    assert cli_main(["leaderboard", str(three_results[0]), str(other), "--out", str(tmp_path / "lb2")]) == 2
    err = capsys.readouterr().err
    assert "refusing to mix results with different definitions" in err and str(other) in err
    assert not (tmp_path / "lb2" / "index.html").exists()


def test_cli_report_terminal_and_html(tmp_path, capsys):
    log = tmp_path / "metrics.jsonl"
    log.write_text(json.dumps({"step": 1, "loss": 2.0, "acc_0": 0.5}) + "\n" + json.dumps({"step": 2, "loss": 1.0,
                                                                                        "acc_0": 0.6}), encoding="utf-8")
    res = write(tmp_path / "eagle3-stories260k.json", make_result(hardware=HW_CPU, training_log=str(log), workloads={
        "spec_bench": workload(2.5, [0.9, 0.6, 0.4], speedup=1.3), "gsm8k": workload(2.2, [0.8, 0.5, 0.3])}))
    assert cli_main(["report", str(res)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert any(ln.startswith("spec_bench") and "2.50" in ln and "1.30×" in ln for ln in lines)
    assert any(ln.startswith("gsm8k") and "2.20" in ln for ln in lines)
    assert "best k=" in out and "0.90 0.60 0.40" in out
    page = res.with_suffix(".html").read_text(encoding="utf-8")
    assert page.count("data:image/png;base64,") == 5  # acceptance, speedup, tau vs k, model, training curve
    assert page.count("<tr data-row=") == 2


def test_model_uses_verify_costs_measured_by_runs_at_other_k(tmp_path):

    def costs(verify):
        return {"draft_step_s": 1e-3, "verify_forward_s": verify, "target_step_s": 4e-3}

    files = [write(tmp_path / f"k{k}.json", make_result(k=k, workloads={"w": workload(
        2.0, [0.8, 0.6, 0.5, 0.4][:k], costs=costs(v), time_split={"draft": 0.3, "verify": 0.7, "overhead": 0.0})}))
        for k, v in ((2, 3e-3), (4, 5e-3))]
    (t,), notes = model_tables(build_rows(load_results(files)[0]), k_max=5)
    assert notes == [] and t.basis.k == 4  # acceptance from the run with the most measured positions
    assert t.costs.verify_by_width == {3: 3e-3, 5: 5e-3}
    preds = t.predictions[1:]
    assert [p.verify_cost_source for p in preds] == ["nearest width", "measured", "interpolated", "measured",
                                                     "nearest width"]
    # round time = k * 1 ms + verify(k + 1): widths 2 -> 3 ms (nearest), 3, 4 -> 4 ms (interpolated), 5, 6 -> 5 ms
    assert [p.round_time_s for p in preds] == pytest.approx([4e-3, 5e-3, 7e-3, 9e-3, 10e-3])


def test_result_without_speed_or_costs_still_ranks_by_acceptance(tmp_path):
    wl = workload(1.9, [0.6, 0.5], speedup=None)
    del wl["aggregate"]["costs"]
    f = write(tmp_path / "results" / "acc-only.json", make_result(drafter="acc-only", k=2, workloads={"w": wl}))
    out = build_leaderboard([f], tmp_path / "lb")
    (row,) = out.rows
    assert row.acceptance_length == 1.9 and row.speedup is None and row.speed_rank is None
    assert row.fmt("speedup") == "—" and row.fmt("ttft_s") == "—"
    assert len(out.notes) == 1 and "no speedup model" in out.notes[0] and "acc-only.json" in out.notes[0]
    assert out.sections[0].by_hardware == {row.hardware: ([], [])}  # no speed pictures without speed


def test_model_counts_rounds_without_a_proposal_as_rejections(tmp_path):
    # An n-gram-like proposer: 10 rounds, but only 4 proposed anything. Conditional on a proposal
    # position 1 is accepted 3/4 of the time; per round only 3/10. The model must give pooled tau.
    wl = workload(1.4, [0.75, 1 / 3])
    wl["requests"] = [{"id": "r0", "rounds": 6, "accepted_by_position": [2, 1], "reached_position": [3, 2]},
                      {"id": "r1", "rounds": 4, "accepted_by_position": [1, 0], "reached_position": [1, 1]}]
    f = write(tmp_path / "ngram.json", make_result(drafter="ngram", kind="ngram", k=2, workloads={"w": wl}))
    (row,) = build_rows(load_results([f])[0])
    assert row.per_position == [0.75, 1 / 3]  # shown as measured by eval
    assert row.model_acceptance == pytest.approx([3 / 10, 1 / 3]) and row.model_acceptance_source == "requests, per round"
    (t,), _ = model_tables([row], k_max=2)
    assert t.predictions[2].expected_tau == pytest.approx(1 + (3 + 1) / 10)  # tokens per round, pooled


def test_trainable_params_reach_rows_and_markdown(tmp_path):
    """A checkpoint's results carry its trainable parameters; the leaderboard shows them, and results
    without them (n-gram, older files) show a dash."""
    with_params = make_result(drafter="eagle3-a")
    with_params["drafter"]["trainable_params"] = 98816
    files = [write(tmp_path / "a.json", with_params), write(tmp_path / "b.json", make_result(drafter="ngram", kind="ngram"))]
    results, _ = load_results(files)
    rows = {r.drafter: r for r in build_rows(results)}
    assert rows["eagle3-a"].trainable_params == 98816 and rows["eagle3-a"].fmt("trainable_params") == "98,816"
    assert rows["ngram"].trainable_params is None and rows["ngram"].fmt("trainable_params") == "—"
    out = build_leaderboard(files, tmp_path / "lb")
    assert "98,816" in out.readme.read_text() and "98,816" in out.index_html.read_text()
