"""Leaderboard numbers that cannot mislead (issue 11, item 17): ranking only within comparison
groups, pooled tau as the headline, k = 0 results accepted, predicted vs measured speedup flagged."""
from __future__ import annotations

import pytest
from result_files import make_result, workload, write

from draftsmith.cli import main as cli_main
from draftsmith.report.leaderboard import build_rows, model_tables
from draftsmith.report.leaderboard_site import build_leaderboard
from draftsmith.report.results_io import load_results


def _requests(ids, tau=2.0, rounds=4):
    return [{"id": i, "rounds": rounds, "acceptance_length": tau, "accepted_by_position": [2, 1, 1][:3],
             "reached_position": [4, 2, 1]} for i in ids]


def test_runs_are_ranked_only_within_their_group(tmp_path):
    def result(name, tau, max_new=64, ids=("a", "b"), top_p=1.0):
        wl = workload(tau, [0.8, 0.5, 0.4], speedup=1.0 + tau / 10)
        wl["requests"] = _requests(ids, tau)
        data = make_result(drafter=name, workloads={"w": wl})
        data["config"].update(max_new_tokens=max_new, top_p=top_p)
        return write(tmp_path / f"{name}.json", data)

    files = [result("base", 2.0), result("peer", 2.5), result("longer", 3.0, max_new=256),
             result("other-prompts", 3.1, ids=("c", "d")), result("top-p", 3.2, top_p=0.9)]
    rows = build_rows(load_results(files)[0])
    by_name = {r.drafter: r for r in rows}
    assert (by_name["peer"].rank, by_name["base"].rank) == (1, 2)  # the one real comparison
    assert by_name["peer"].group_key == by_name["base"].group_key
    for alone in ("longer", "other-prompts", "top-p"):  # better tau, but measured under other conditions
        assert by_name[alone].rank == 1 and by_name[alone].speed_rank == 1
        assert by_name[alone].group_key != by_name["base"].group_key
    assert (by_name["peer"].speed_rank, by_name["base"].speed_rank) == (1, 2)
    assert "max_new_tokens=256" in by_name["longer"].group and "2 prompts #" in by_name["base"].group

    out = build_leaderboard(files, tmp_path / "lb")
    html = out.index_html.read_text(encoding="utf-8")
    readme = out.readme.read_text(encoding="utf-8")
    assert html.count("Group: w · k=3 · T=0") == 4 and readme.count("### Group: w · k=3 · T=0") == 4
    assert "T=0 top_p=0.9 (greedy)" in html


def test_headline_tau_is_pooled(tmp_path):
    wl = workload(2.0, [0.8, 0.5, 0.4])  # mean over requests 2.0 ...
    wl["aggregate"]["acceptance_length"]["pooled"] = 1.5  # ... but long requests accept less
    old = workload(2.0, [0.8, 0.5, 0.4])
    del old["aggregate"]["acceptance_length"]["pooled"]  # a result written before the field existed
    old["requests"] = _requests(["a"], tau=3.0, rounds=1) + _requests(["b"], tau=1.0, rounds=3)
    files = [write(tmp_path / "new.json", make_result(drafter="new", workloads={"w": wl})),
             write(tmp_path / "old.json", make_result(drafter="old", workloads={"w": old}))]
    rows = {r.drafter: r for r in build_rows(load_results(files)[0])}
    assert rows["new"].acceptance_length == 1.5 and rows["new"].tau_source == "pooled"
    assert rows["old"].acceptance_length == pytest.approx((3 * 1 + 1 * 3) / 4)  # not the mean 2.0
    assert rows["old"].tau_source == "pooled from requests"


def test_k0_results_are_valid_input(tmp_path, capsys):
    wl = workload(1.0, [], speedup=1.0, alpha=0.0)
    wl["aggregate"]["acceptance_rate"] = None  # nothing proposed: written as null
    k0 = write(tmp_path / "k0.json", make_result(drafter="target-only", kind="ngram", k=0, workloads={"w": wl}))
    assert cli_main(["report", str(k0), "--no-html"]) == 0
    assert cli_main(["leaderboard", str(k0), "--out", str(tmp_path / "lb")]) == 0
    assert "1 rows from 1 files" in capsys.readouterr().out


def test_predicted_and_measured_disagreement_is_flagged(tmp_path):
    # Costs that predict ~2x at k = 1 (high acceptance, cheap drafting) while 0.41x was measured under load.
    costs = {"draft_step_s": 1e-4, "verify_forward_s": 4e-3, "target_step_s": 4e-3}
    wl = workload(1.97, [0.97], speedup=0.41, costs=costs, time_split={"draft": 0.1, "verify": 0.9, "overhead": 0.0})
    f = write(tmp_path / "loaded.json", make_result(drafter="busy", k=1, workloads={"w": wl}))
    (t,), _ = model_tables(build_rows(load_results([f])[0]), k_max=1)
    assert t.best.k == 1 and t.best.speedup == pytest.approx(1.97 * 4 / 4.1)
    assert 1 in t.flags and "measured 0.41×" in t.flags[1] and "p10–p90 0.31–0.51×" in t.flags[1]
    assert "does not hold" in t.recommendation()
    out = build_leaderboard([f], tmp_path / "lb", k_max=1)
    for page in (out.index_html, out.readme):
        text = page.read_text(encoding="utf-8")
        assert "DISAGREE: measured 0.41×" in text and "does not hold" in text
    # within the measured spread: no flag
    ok = workload(1.97, [0.97], speedup=1.9, costs=costs, time_split={"draft": 0.1, "verify": 0.9, "overhead": 0.0})
    g = write(tmp_path / "idle.json", make_result(drafter="idle", k=1, workloads={"w": ok}))
    (t2,), _ = model_tables(build_rows(load_results([g])[0]), k_max=1)
    assert t2.flags == {} and "does not hold" not in t2.recommendation()
