"""The speedup model against hand-computed cases (Leviathan et al. 2023, per-position form)."""
from __future__ import annotations

import pytest

from draftsmith.report import speedup_model as sm


def test_hand_computed_case():
    # a = [0.8, 0.5]; draft step 1 ms, verify forward (width 3) 2 ms, target step 2 ms, no overhead.
    # k=1: E = 1 + 0.8 = 1.8;                     round = 1 + 2 = 3; speedup = 1.8 * 2 / 3 = 1.2
    # k=2: E = 1 + 0.8 + 0.8*0.5 = 2.2;           round = 2 + 2 = 4; speedup = 2.2 * 2 / 4 = 1.1
    # k=3: E = 2.2 + 0.4*0.5 = 2.4 (a3 := a2);    round = 3 + 2 = 5; speedup = 2.4 * 2 / 5 = 0.96
    costs = sm.Costs(draft_step_s=1e-3, verify_forward_s=2e-3, target_step_s=2e-3, verify_width=3)
    preds = sm.predict_all([0.8, 0.5], costs, k_max=3)
    assert [p.k for p in preds] == [0, 1, 2, 3]
    assert [p.expected_tau for p in preds] == pytest.approx([1.0, 1.8, 2.2, 2.4])
    assert [p.speedup for p in preds] == pytest.approx([1.0, 1.2, 1.1, 0.96])
    assert [p.extrapolated for p in preds] == [False, False, False, True]
    assert [p.verify_cost_source for p in preds[1:]] == ["assumed constant", "measured", "assumed constant"]
    assert sm.best_k(preds).k == 1


def test_constant_alpha_matches_leviathan_closed_form():
    alpha, k = 0.7, 5
    tau, _ = sm.expected_tau([alpha] * k, k)
    assert tau == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_costs_table_per_width_and_overhead_from_time_split():
    agg = {"costs": {"draft_step_s": 1e-3, "verify_forward_s": 2e-3, "target_step_s": 2e-3,
                     "verify_forward_s_by_width": {"2": 1.5e-3, "3": 2e-3}},
           "time_split": {"draft": 0.3, "verify": 0.5, "overhead": 0.25}}
    costs = sm.costs_from_aggregate(agg, k=2)
    # overhead per round = verify_forward * overhead / verify = 2 ms * 0.25 / 0.5 = 1 ms
    assert costs.overhead_per_round_s == pytest.approx(1e-3) and costs.overhead_source == "time split"
    p1 = sm.predict([0.8, 0.5], costs, 1)  # width 2 measured: round = 1 + 1.5 + 1 = 3.5 ms
    assert p1.verify_cost_source == "measured" and p1.speedup == pytest.approx(1.8 * 2 / 3.5)
    p4 = sm.predict([0.8, 0.5], costs, 4)  # width 5 -> nearest measured width 3 (2 ms)
    assert p4.verify_cost_source == "nearest width" and p4.round_time_s == pytest.approx(4e-3 + 2e-3 + 1e-3)


def test_verify_cost_interpolated_between_measured_widths():
    costs = sm.Costs(draft_step_s=1e-3, verify_forward_s=2e-3, target_step_s=2e-3, verify_width=2,
                     verify_by_width={2: 2e-3, 6: 4e-3})
    assert costs.verify_at(4) == (pytest.approx(3e-3), "interpolated")  # 2 + (4 - 2) * (4 - 2) / (6 - 2) ms
    assert costs.verify_at(6) == (4e-3, "measured") and costs.verify_at(9) == (4e-3, "nearest width")


def test_no_k_beats_target_only_recommends_zero():
    costs = sm.Costs(draft_step_s=5e-3, verify_forward_s=4e-3, target_step_s=2e-3, verify_width=3)
    assert sm.best_k(sm.predict_all([0.3, 0.2], costs, 4)).k == 0


def test_missing_costs_give_no_model():
    assert sm.costs_from_aggregate({"costs": {"draft_step_s": 1e-3}}, k=2) is None


def test_unreached_positions_and_measured_round_overhead():
    # Position 3 was never reached (a2 = 0): NaN / None there adds nothing, also when extrapolated.
    assert sm.expected_tau([0.5, 0.0, float("nan")], 3)[0] == 1.5
    assert sm.expected_tau([0.5, 0.0, None], 5) == (1.5, True)
    agg = {"costs": {"draft_step_s": 1e-3, "verify_forward_s": 2e-3, "target_step_s": 2e-3},
           "time_split": {"draft": 0.3, "verify": 0.5, "overhead": 0.2}, "time_per_round_s": {"overhead": 5e-4}}
    costs = sm.costs_from_aggregate(agg, k=2)
    assert (costs.overhead_per_round_s, costs.overhead_source) == (5e-4, "measured")
