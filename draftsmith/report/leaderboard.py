"""Leaderboard rows from validated results, their comparison groups, their order, and the
speedup-model tables.

Groups: runs are ranked only against runs they can be compared with, those that share the
target, workload, k (or tree budget), temperature and the rest of the sampling transform,
verification rule, max_new_tokens and prompt set (`group_key`). Each group is shown as its own
table with its shared settings as the heading.
Order rule (explicit, used by the HTML page, README.md and rows.json alike):
  targets by name; within a target, workloads by name; then groups by k, temperature,
  verification, max_new_tokens, prompt set; within a group: acceptance length (pooled tau)
  desc, acceptance rate desc, then drafter, hardware, file (ascending) so that the order is
  total and repeatable. `rank` is the position within the group.
Acceptance may be compared across hardware. Speed is not: `speed_rank` ranks speedup median
only among rows of the same group and hardware, and the page's sort on a speed column sorts
within hardware first.
The headline tau is pooled (sum of committed tokens / sum of rounds over the workload), the
quantity the speedup model predicts; results written before `acceptance_length.pooled`
existed get it from their requests, else their mean over requests (`tau_source` says which).
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from draftsmith.report import speedup_model as sm
from draftsmith.report.results_io import Result

# (key, header, format, is_speed) for the metric columns, in display order.
METRIC_COLUMNS = (
    ("acceptance_length", "acc. length τ", "{:.2f}", False),
    ("acceptance_rate", "acc. rate α", "{:.1%}", False),
    ("engine_tau", "engine τ", "{:.2f}", False),  # the same drafter served by a real engine (eval --engine)
    ("speedup", "speedup", "{:.2f}×", True),
    ("tpot_speedup", "TPOT speedup", "{:.2f}×", True),
    ("tokens_per_s", "tokens/s", "{:.1f}", True),
    ("ttft_s", "TTFT ms", "ms", True),
    ("tpot_s", "TPOT ms", "ms", True),
    ("latency_p90_s", "p90 latency s", "{:.3f}", True),
    ("memory_mb", "memory MB", "{:.0f}", True),
    ("trainable_params", "trainable params", "{:,.0f}", False),  # what training updated: compare kinds at equal size
)
KEY_COLUMNS = (("target", "target"), ("drafter_kind", "kind"), ("drafter", "drafter"), ("workload", "workload"),
               ("k", "k"), ("temperature", "T"), ("hardware", "hardware"))


@dataclass
class Row:
    target: str
    drafter_kind: str
    drafter: str
    workload: str
    k: int
    temperature: float
    hardware: str
    acceptance_length: float
    acceptance_rate: float
    speedup: float | None
    tokens_per_s: float | None
    ttft_s: float | None
    tpot_s: float | None
    latency_p90_s: float | None
    memory_mb: float | None
    per_position: list[float]
    source: str
    command: str
    speedup_p10: float | None = None
    speedup_p90: float | None = None
    target_tokens_per_s: float | None = None
    tpot_speedup: float | None = None  # decode only: target TPOT / speculative TPOT
    trainable_params: int | None = None  # parameters the drafter's training updated (None: not recorded)
    engine_tau: float | None = None  # tau of the same drafter in a real engine on the same prompts (eval --engine)
    verification: str = "greedy"
    max_new_tokens: int | None = None
    sampling: tuple = (0, 1.0)  # (top_k, top_p)
    tree_budget: int | None = None
    prompt_set: str = ""  # "N prompts #hash of their ids"
    tau_source: str = "pooled"  # pooled | pooled from requests | mean over requests (old result)
    rank: int | None = None  # position within its group (group_key)
    speed_rank: int | None = None
    # acceptance the speedup model uses, and where it came from (see per_round_acceptance)
    model_acceptance: list[float] = field(default_factory=list)
    model_acceptance_source: str = "aggregate"
    aggregate: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple:
        return (self.target, self.drafter_kind, self.drafter, self.workload, self.k, self.temperature, self.hardware)

    @property
    def group_key(self) -> tuple:
        """Rows are ranked only against rows with the same group key."""
        depth = ("tree", self.tree_budget) if self.tree_budget is not None else ("k", self.k)
        return (self.target, self.workload, depth, self.temperature, self.sampling, self.verification,
                self.max_new_tokens if self.max_new_tokens is not None else -1, self.prompt_set)

    @property
    def group(self) -> str:
        """The group's shared settings, as its heading."""
        depth = f"tree budget {self.tree_budget}" if self.tree_budget is not None else f"k={self.k}"
        top_k, top_p = self.sampling
        extra = (f" top_k={top_k}" if top_k else "") + (f" top_p={top_p:g}" if top_p != 1.0 else "")
        return (f"{self.workload} · {depth} · T={self.temperature:g}{extra} ({self.verification}) · "
                f"max_new_tokens={'?' if self.max_new_tokens is None else self.max_new_tokens} · {self.prompt_set}")

    def fmt(self, column: str) -> str:
        """The display text of a metric column ('—' when the result did not measure it)."""
        spec = next(c[2] for c in METRIC_COLUMNS if c[0] == column)
        value = getattr(self, column)
        if value is None or not math.isfinite(value):
            return "—"
        return f"{value * 1e3:.2f}" if spec == "ms" else spec.format(value)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("aggregate")
        return out


def _num(agg: dict, dotted: str) -> float | None:
    cur: Any = agg
    for part in dotted.split("."):
        cur = cur.get(part) if isinstance(cur, dict) else None
    if not isinstance(cur, (int, float)) or isinstance(cur, bool) or not math.isfinite(cur):
        return None  # absent, or NaN (e.g. nothing to measure): shown as '—'
    return float(cur)


def _desc(x: float | None) -> float:
    """Sort key for a descending column; missing / NaN values go last."""
    return -x if x is not None and math.isfinite(x) else math.inf


def rows_from_result(result: Result) -> list[Row]:
    """One row per workload of one result file."""
    rows = []
    for workload, wl in result.workloads.items():
        agg = wl["aggregate"]
        tau, tau_source = pooled_tau(agg, wl.get("requests") or [])
        rate = agg["acceptance_rate"]
        rows.append(Row(
            target=result.target_name, drafter_kind=result.drafter_kind, drafter=result.drafter_name,
            workload=workload, k=result.k, temperature=result.temperature, hardware=result.hardware,
            acceptance_length=tau, acceptance_rate=math.nan if rate is None else float(rate),
            speedup=_num(agg, "speedup.median"), tokens_per_s=_num(agg, "spec_tokens_per_s.median"),
            ttft_s=_num(agg, "ttft_s.median"), tpot_s=_num(agg, "tpot_s.median"),
            latency_p90_s=_num(agg, "latency_s.p90"), memory_mb=_num(agg, "peak_memory_mb"),
            per_position=[math.nan if a is None else float(a) for a in agg["per_position_acceptance"]],
            source=str(result.path), command=result.command,
            speedup_p10=_num(agg, "speedup.p10"), speedup_p90=_num(agg, "speedup.p90"),
            target_tokens_per_s=_num(agg, "target_tokens_per_s.median"), tpot_speedup=_num(agg, "tpot_speedup.median"),
            trainable_params=result.trainable_params, engine_tau=_num(wl.get("engine") or {}, "acceptance_length"),
            verification=result.verification, max_new_tokens=result.max_new_tokens, sampling=result.sampling,
            tree_budget=result.tree_budget, prompt_set=prompt_set(wl), tau_source=tau_source, aggregate=agg))
        per_round = per_round_acceptance(wl.get("requests") or [], result.k)
        row = rows[-1]
        row.model_acceptance, row.model_acceptance_source = (
            (per_round, "requests, per round") if per_round is not None else (row.per_position, "aggregate"))
    return rows


def pooled_tau(agg: dict, requests: list) -> tuple[float, str]:
    """(tau, source): sum committed / sum rounds. From the aggregate's `pooled`; for older results
    from the requests (each request's tau x its rounds); else the mean over requests, marked."""
    pooled = _num(agg, "acceptance_length.pooled")
    if pooled is not None:
        return pooled, "pooled"
    pairs = [(r.get("acceptance_length"), r.get("rounds")) for r in requests if isinstance(r, dict)]
    if pairs and all(isinstance(t, (int, float)) and isinstance(n, int) for t, n in pairs):
        rounds = sum(n for _t, n in pairs)
        if rounds:
            return sum(t * n for t, n in pairs if n) / rounds, "pooled from requests"
    return float(agg["acceptance_length"]["mean"]), "mean over requests (old result)"


def prompt_set(wl: dict) -> str:
    """A short name for the prompts a workload ran: their count and a hash of their ids."""
    ids = [r.get("id") for r in wl.get("requests") or [] if isinstance(r, dict)]
    if ids and all(isinstance(i, str) for i in ids):
        digest = hashlib.sha256(json.dumps(sorted(ids)).encode()).hexdigest()[:8]
        return f"{len(ids)} prompts #{digest}"
    return f"{wl.get('num_requests', '?')} prompts (ids not recorded)"


def per_round_acceptance(requests: list[dict], k: int) -> list[float] | None:
    """Per-position acceptance counted per ROUND: a_i = A_i / A_{i-1}, A_0 = rounds, A_i = rounds whose
    draft position i was accepted (pooled over requests); so 1 + sum_i prod_{j<=i} a_j = pooled tau.

    It differs from the aggregate's per_position_acceptance (conditional on position i being proposed)
    when a proposer drafts fewer than k tokens in some rounds (n-gram without a match): for the speed
    model a missing proposal is a rejection. None when the requests do not carry the counts.
    """
    counts = [0] * (k + 1)
    for r in requests:
        acc = r.get("accepted_by_position") if isinstance(r, dict) else None
        if not isinstance(r.get("rounds") if isinstance(r, dict) else None, int) or not isinstance(acc, list) \
                or len(acc) != k or not all(isinstance(a, int) for a in acc):
            return None
        counts[0] += r["rounds"]
        for i, a in enumerate(acc, 1):
            counts[i] += a
    if not counts[0]:
        return None
    return [counts[i] / counts[i - 1] if counts[i - 1] else math.nan for i in range(1, k + 1)]


def order_key(row: Row) -> tuple:
    """The leaderboard order (see the module docstring)."""
    return (*row.group_key, _desc(row.acceptance_length), _desc(row.acceptance_rate), row.drafter, row.hardware,
            row.source)


def build_rows(results: list[Result]) -> list[Row]:
    """All rows of all results (none dropped, duplicates of a key kept), ordered, with ranks within
    their group and speed ranks within (group, hardware)."""
    rows = sorted((row for r in results for row in rows_from_result(r)), key=order_key)
    for group in group_rows(rows).values():
        for i, row in enumerate(group, 1):
            row.rank = i
    assign_speed_ranks(rows)
    return rows


def group_rows(rows: list[Row]) -> dict[tuple, list[Row]]:
    """Rows by comparison group (Row.group_key), groups and rows in the order given."""
    out: dict[tuple, list[Row]] = {}
    for row in rows:
        out.setdefault(row.group_key, []).append(row)
    return out


def assign_speed_ranks(rows: list[Row]) -> None:
    """speed_rank = 1 + number of rows with a higher speedup in the same group and hardware."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        if row.speedup is not None:
            groups.setdefault((row.group_key, row.hardware), []).append(row)
    for group in groups.values():
        for row in group:
            row.speed_rank = 1 + sum(other.speedup > row.speedup for other in group)


def group_by_target(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for row in rows:
        out.setdefault(row.target, []).append(row)
    return out


@dataclass
class ModelTable:
    """Speedup model for one (target, drafter, workload, temperature, hardware): predictions from the
    row with the most measured positions, next to every measured row of that setting."""

    target: str
    drafter: str
    workload: str
    temperature: float
    hardware: str
    basis: Row
    costs: sm.Costs
    predictions: list[sm.Prediction]
    best: sm.Prediction
    measured: dict[int, Row]
    # k -> why the prediction at k disagrees with the measurement at k (outside its p10-p90 spread)
    flags: dict[int, str] = field(default_factory=dict)

    @property
    def best_measured(self) -> Row | None:
        """The measured row with the highest median speedup (None when no row measured speed)."""
        rows = [r for r in self.measured.values() if r.speedup is not None]
        return max(rows, key=lambda r: (r.speedup, -r.k)) if rows else None

    def recommendation(self) -> str:
        """One sentence: the model's best k, and what was measured there when they disagree."""
        b = self.best
        text = f"Recommended k = {b.k} (predicted {b.speedup:.2f}×{', extrapolated' if b.extrapolated else ''})"
        if b.k in self.flags:
            m = self.best_measured
            text += (f" — but {self.flags[b.k]}: the model does not hold for this setting; trust the measured "
                     f"speedup" + (f" (best measured: k = {m.k} at {m.speedup:.2f}×)" if m else ""))
        return text + "."


def disagreement(pred: sm.Prediction, row: Row | None) -> str | None:
    """Why a predicted speedup disagrees with the measured one at the same k: it lies outside the
    measured spread over prompts (p10-p90). None when they agree, or nothing to compare."""
    if row is None or row.speedup is None or row.speedup_p10 is None or row.speedup_p90 is None:
        return None
    if row.speedup_p10 <= pred.speedup <= row.speedup_p90:
        return None
    return (f"measured {row.speedup:.2f}× (p10–p90 {row.speedup_p10:.2f}–{row.speedup_p90:.2f}×) at k = {pred.k}, "
            f"predicted {pred.speedup:.2f}×")


def model_tables(rows: list[Row], k_max: int = 8) -> tuple[list[ModelTable], list[str]]:
    """Speedup-model tables per setting, and notes for the settings that could not be modelled."""
    settings: dict[tuple, list[Row]] = {}
    for row in rows:  # one setting: everything of the comparison group but k, plus drafter and hardware
        settings.setdefault((row.target, row.drafter_kind, row.drafter, row.workload, row.temperature, row.hardware,
                             row.sampling, row.verification, row.max_new_tokens or -1, row.prompt_set,
                             row.tree_budget is not None), []).append(row)
    tables, notes = [], []
    for (target, _kind, drafter, workload, temp, hw, *_same), group in sorted(settings.items(), key=lambda kv: kv[0]):
        basis = max(group, key=lambda r: (r.k, r.source))
        costs = sm.costs_from_aggregate(basis.aggregate, basis.k, where=basis.source)
        if costs is None or basis.k == 0:
            notes.append(f"{drafter} on {workload} ({hw}): no speedup model — {basis.source} lacks "
                         "costs.draft_step_s / verify_forward_s / target_step_s or has k = 0")
            continue
        costs = _with_widths_from(group, costs)
        preds = sm.predict_all(basis.model_acceptance, costs, max(k_max, basis.k))
        measured = {}
        for row in sorted(group, key=lambda r: r.source):
            measured.setdefault(row.k, row)
        flags = {p.k: f for p in preds if (f := disagreement(p, measured.get(p.k))) is not None}
        tables.append(ModelTable(target, drafter, workload, temp, hw, basis, costs, preds, sm.best_k(preds), measured,
                                 flags))
    return tables, notes


def _with_widths_from(group: list[Row], costs: sm.Costs) -> sm.Costs:
    """Add the verification cost each row of the setting measured (width k+1) to the basis's costs table."""
    table = dict(costs.verify_by_width or {})
    for row in sorted(group, key=lambda r: r.source):
        c = sm.costs_from_aggregate(row.aggregate, row.k, where=row.source)
        if c is not None and row.k > 0:
            table.setdefault(row.k + 1, c.verify_forward_s)
    table.setdefault(costs.verify_width, costs.verify_forward_s)
    if len(table) < 2:
        return costs
    return replace(costs, verify_by_width=table)
