"""DistillSpec divergences (heads/divergences.py) against their closed forms on hand-made distributions."""
from __future__ import annotations

import math

import pytest
import torch

from draftsmith.heads import divergences as dv

P = [0.5, 0.3, 0.2]
Q = [0.2, 0.2, 0.6]


def logs(*dists):
    return [torch.tensor(d, dtype=torch.float64).log() for d in dists]


def test_forward_kl_closed_form():
    logp, logq = logs(P, Q)
    want = 0.5 * math.log(0.5 / 0.2) + 0.3 * math.log(0.3 / 0.2) + 0.2 * math.log(0.2 / 0.6)
    assert dv.forward_kl(logp, logq).item() == pytest.approx(want, rel=1e-12)


def test_reverse_kl_closed_form():
    logp, logq = logs(P, Q)
    want = 0.2 * math.log(0.2 / 0.5) + 0.2 * math.log(0.2 / 0.3) + 0.6 * math.log(0.6 / 0.2)
    assert dv.reverse_kl(logp, logq).item() == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("beta", [0.5, 0.2])
def test_jsd_closed_form(beta):
    logp, logq = logs(P, Q)
    m = [beta * p + (1 - beta) * q for p, q in zip(P, Q)]
    kl_pm = sum(p * math.log(p / mi) for p, mi in zip(P, m))
    kl_qm = sum(q * math.log(q / mi) for q, mi in zip(Q, m))
    want = beta * kl_pm + (1 - beta) * kl_qm
    assert dv.jsd(logp, logq, beta).item() == pytest.approx(want, rel=1e-12)
    # JSD[beta](p || q) = JSD[1 - beta](q || p), and the symmetric JSD is bounded by log 2
    assert dv.jsd(logq, logp, 1 - beta).item() == pytest.approx(want, rel=1e-12)
    assert dv.jsd(logp, logq, 0.5).item() <= math.log(2)


def test_total_variation_and_acceptance_rate_closed_form():
    logp, logq = logs(P, Q)
    assert dv.total_variation(logp, logq).item() == pytest.approx(0.5 * (0.3 + 0.1 + 0.4), rel=1e-12)  # 0.4
    assert dv.acceptance_rate(logp, logq).item() == pytest.approx(0.2 + 0.2 + 0.2, rel=1e-12)  # min(p, q)
    assert dv.acceptance_rate(logp, logq).item() == pytest.approx(1 - dv.total_variation(logp, logq).item())


def test_mix_is_the_weighted_sum_and_batches():
    logp = torch.stack(logs(P, Q))  # [2, 3]: rows (p, q) ...
    logq = torch.stack(logs(Q, P))  # ... against (q, p)
    weights = dv.parse_weights({"tv": 0.5, "fkl": 0.5})
    got = dv.mixed(weights, logp, logq)
    assert got.shape == (2,)
    want0 = 0.5 * 0.4 + 0.5 * dv.forward_kl(*logs(P, Q)).item()
    want1 = 0.5 * 0.4 + 0.5 * dv.reverse_kl(*logs(P, Q)).item()  # KL(q || p)
    assert got.tolist() == pytest.approx([want0, want1], rel=1e-12)


@pytest.mark.parametrize("name", sorted(dv.DIVERGENCES))
def test_identical_distributions_give_zero(name):
    logp, _ = logs(P, Q)
    assert dv.mixed({name: 1.0}, logp, logp.clone()).item() == pytest.approx(0.0, abs=1e-12)
    assert dv.acceptance_rate(logp, logp).item() == pytest.approx(1.0)


@pytest.mark.parametrize("spec, match", [("kl", "unknown"), ({"tv": -1.0}, ">= 0"), ({"tv": 0.0}, "sum to 0"),
                                         ({}, "give a name")])
def test_bad_specs_name_the_problem(spec, match):
    with pytest.raises(ValueError, match=match):
        dv.parse_weights(spec)


def test_gradients_flow_to_the_draft():
    logp = torch.tensor(P).log()
    for name in dv.DIVERGENCES:
        logits = torch.tensor(Q).log().requires_grad_(True)
        dv.mixed({name: 1.0}, logp, torch.log_softmax(logits, -1)).backward()
        assert logits.grad is not None and float(logits.grad.abs().sum()) > 0, name
