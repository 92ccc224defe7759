"""Predict speculative-decoding speedup at every k from one measured result.

Model (Leviathan et al. 2023, "Fast Inference from Transformers via Speculative Decoding",
Sec. 3.1 and 3.4, generalised from one acceptance rate alpha to per-position acceptance):

    a_i          = P(draft position i accepted | positions < i accepted), i = 1..k  (measured)
    P(tau > i)   = prod_{j <= i} a_j                 (at least i drafts accepted)
    E[tau]       = 1 + sum_{i=1..k} prod_{j <= i} a_j
    round time   = k * draft_step + verify_forward(k + 1) + overhead_per_round
    speedup(k)   = E[tau] * target_step / round time

With a constant a_i = alpha this is Leviathan's E[tau] = (1 - alpha^(k+1)) / (1 - alpha).

Assumptions, each marked in the output:
- Positions beyond the measured ones repeat the last measured a_i (`extrapolated=True`).
  A drafter that was never run past position m has no evidence for m+1; repeating a_m is
  optimistic for heads whose accuracy decays with depth (EAGLE, Medusa).
- verify_forward(w) comes from a costs table per width when there is one: the result's
  `costs.verify_forward_s_by_width` ({"w": seconds}), or the leaderboard's results of the same
  drafter at other k (each measures width k+1). Between measured widths the cost is
  interpolated linearly ("interpolated"), beyond them the nearest measured width is used
  ("nearest width"). With a single measured width it is assumed to cost the same at every
  width ("assumed constant"). On CPU bf16 a forward over
  8 tokens costs about as much as over 1, so this holds up to k ~ 7 there; in fp32 or on an
  overloaded GPU it flatters large k.
- overhead_per_round: `costs.round_overhead_s` or `time_per_round_s.overhead` when present;
  else estimated from the time split as verify_forward * overhead_fraction / verify_fraction; else 0 (then the speedup is
  an upper bound and `overhead_source="none"`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable, TypeVar

from draftsmith.core.errors import UserError

# `draftsmith profile`'s speedup profile (eval/profile.py: the same model over batch size and context),
# written beside the checkpoint and copied into exports (export/api.py) and leaderboards.
PROFILE_FILE = "speedup_profile.json"
PROFILE_SCHEMA = "draftsmith.speedup-profile"
P = TypeVar("P")


@dataclass(frozen=True)
class Costs:
    """Measured seconds: one draft step, one target verification forward of width `verify_width`,
    one target-only decode step, and per-round loop overhead."""

    draft_step_s: float
    verify_forward_s: float
    target_step_s: float
    verify_width: int
    overhead_per_round_s: float = 0.0
    overhead_source: str = "none"
    verify_by_width: dict[int, float] | None = None

    def verify_at(self, width: int) -> tuple[float, str]:
        """Cost of a verification forward over `width` tokens, and where the number came from."""
        if self.verify_by_width:
            if width in self.verify_by_width:
                return self.verify_by_width[width], "measured"
            widths = sorted(self.verify_by_width)
            if widths[0] < width < widths[-1]:
                lo = max(w for w in widths if w < width)
                hi = min(w for w in widths if w > width)
                c_lo, c_hi = self.verify_by_width[lo], self.verify_by_width[hi]
                return c_lo + (c_hi - c_lo) * (width - lo) / (hi - lo), "interpolated"
            nearest = widths[0] if width < widths[0] else widths[-1]
            return self.verify_by_width[nearest], "nearest width"
        if width == self.verify_width:
            return self.verify_forward_s, "measured"
        return self.verify_forward_s, "assumed constant"


@dataclass(frozen=True)
class Prediction:
    k: int
    expected_tau: float          # E[tokens per round]
    round_time_s: float
    speedup: float
    extrapolated: bool           # uses acceptance beyond the measured positions
    verify_cost_source: str      # measured | interpolated | nearest width | assumed constant


def expected_tau(acceptance: list[float], k: int) -> tuple[float, bool]:
    """E[tau] at depth k from per-position conditional acceptance (Leviathan et al. 2023, Eq. 1 generalised).

    1. a_i for i > len(acceptance) repeats the last measured value (marked extrapolated). A NaN / None
       a_i (a position no round reached) follows an a_j = 0 and adds nothing.
    2. survival_i = prod_{j<=i} a_j is P(at least i drafts accepted).
    3. E[tau] = 1 (the correction / bonus token) + sum of survivals.
    """
    if k > 0 and not acceptance:
        raise UserError("expected_tau needs at least one measured per-position acceptance for k > 0")
    tau, survival = 1.0, 1.0
    for i in range(k):
        a_i = acceptance[i] if i < len(acceptance) else acceptance[-1]  # 1. extrapolate
        survival *= 0.0 if a_i is None or math.isnan(a_i) else a_i  # 2. unreached position: survival is 0
        tau += survival  # 3.
    return tau, k > len(acceptance)


def predict(acceptance: list[float], costs: Costs, k: int) -> Prediction:
    """Predicted speedup at draft depth k (k = 0 is target-only decoding: speedup 1).

    1. E[tau] from expected_tau.
    2. round time = k * draft_step + verify_forward(k + 1) + overhead.
    3. speedup = E[tau] * target_step / round time.
    """
    if k == 0:
        return Prediction(0, 1.0, costs.target_step_s, 1.0, False, "measured")
    tau, extrapolated = expected_tau(acceptance, k)  # 1.
    verify, source = costs.verify_at(k + 1)
    round_time = k * costs.draft_step_s + verify + costs.overhead_per_round_s  # 2.
    return Prediction(k, tau, round_time, tau * costs.target_step_s / round_time, extrapolated, source)  # 3.


def predict_all(acceptance: list[float], costs: Costs, k_max: int) -> list[Prediction]:
    """Predictions for k = 0..k_max."""
    return [predict(acceptance, costs, k) for k in range(k_max + 1)]


def best(predictions: Iterable[P], speedup: Callable[[P], float], k: Callable[[P], int]) -> P:
    """The one tie-break of every speedup recommendation (this model, eval/profile.py's grid): the highest
    speedup wins (k = 0 when no k beats target-only decoding); ties go to the smaller k."""
    return max(predictions, key=lambda p: (speedup(p), -k(p)))


def best_k(predictions: list[Prediction]) -> Prediction:
    """The prediction with the highest speedup; ties go to the smaller k (best)."""
    return best(predictions, lambda p: p.speedup, lambda p: p.k)


def costs_from_aggregate(aggregate: dict[str, Any], k: int, where: str = "result") -> Costs | None:
    """Costs from a workload's aggregate (docs/results-schema.md); None when any of the three
    required costs is missing (the model then cannot run for that row)."""
    c = aggregate.get("costs") or {}
    needed = ("draft_step_s", "verify_forward_s", "target_step_s")
    if any(not isinstance(c.get(key), (int, float)) or not c.get(key) > 0 or not math.isfinite(c[key]) for key in needed):
        return None
    by_width = None
    if isinstance(c.get("verify_forward_s_by_width"), dict):
        try:
            by_width = {int(w): float(s) for w, s in c["verify_forward_s_by_width"].items()}
        except (TypeError, ValueError) as err:
            raise UserError(f"{where}: costs.verify_forward_s_by_width must map width -> seconds ({err})") from err
    overhead, source = 0.0, "none"
    split = aggregate.get("time_split") or {}
    per_round = (aggregate.get("time_per_round_s") or {}).get("overhead")
    if isinstance(c.get("round_overhead_s"), (int, float)):
        overhead, source = float(c["round_overhead_s"]), "measured"
    elif isinstance(per_round, (int, float)) and math.isfinite(per_round):
        overhead, source = float(per_round), "measured"
    elif isinstance(split.get("overhead"), (int, float)) and (split.get("verify") or 0) > 0:
        overhead = float(c["verify_forward_s"]) * split["overhead"] / split["verify"]
        source = "time split"
    return Costs(draft_step_s=float(c["draft_step_s"]), verify_forward_s=float(c["verify_forward_s"]),
                 target_step_s=float(c["target_step_s"]), verify_width=k + 1,
                 overhead_per_round_s=overhead, overhead_source=source, verify_by_width=by_width)
