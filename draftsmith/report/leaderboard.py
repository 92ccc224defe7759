"""Leaderboard rows from validated results, their order, and the speedup-model tables.

Order rule (explicit, used by the HTML page, README.md and rows.json alike):
  targets by name; within a target, workloads by name; within (target, workload):
  acceptance length desc, acceptance rate desc, then drafter, k, temperature, hardware, file
  (ascending) so that the order is total and repeatable.
Acceptance may be compared across hardware. Speed is not: `speed_rank` ranks speedup median
only among rows of the same (target, workload, hardware), and the page's sort on a speed
column sorts within hardware first.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from draftsmith.report import speedup_model as sm
from draftsmith.report.results_io import Result

# (key, header, format, is_speed) for the metric columns, in display order.
METRIC_COLUMNS = (
    ("acceptance_length", "acc. length τ", "{:.2f}", False),
    ("acceptance_rate", "acc. rate α", "{:.1%}", False),
    ("speedup", "speedup", "{:.2f}×", True),
    ("tokens_per_s", "tokens/s", "{:.1f}", True),
    ("ttft_s", "TTFT ms", "ms", True),
    ("tpot_s", "TPOT ms", "ms", True),
    ("latency_p90_s", "p90 latency s", "{:.3f}", True),
    ("memory_mb", "memory MB", "{:.0f}", True),
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
    speed_rank: int | None = None
    # acceptance the speedup model uses, and where it came from (see per_round_acceptance)
    model_acceptance: list[float] = field(default_factory=list)
    model_acceptance_source: str = "aggregate"
    aggregate: dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def key(self) -> tuple:
        return (self.target, self.drafter_kind, self.drafter, self.workload, self.k, self.temperature, self.hardware)

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
        rows.append(Row(
            target=result.target_name, drafter_kind=result.drafter_kind, drafter=result.drafter_name,
            workload=workload, k=result.k, temperature=result.temperature, hardware=result.hardware,
            acceptance_length=float(agg["acceptance_length"]["mean"]), acceptance_rate=float(agg["acceptance_rate"]),
            speedup=_num(agg, "speedup.median"), tokens_per_s=_num(agg, "spec_tokens_per_s.median"),
            ttft_s=_num(agg, "ttft_s.median"), tpot_s=_num(agg, "tpot_s.median"),
            latency_p90_s=_num(agg, "latency_s.p90"), memory_mb=_num(agg, "peak_memory_mb"),
            per_position=[math.nan if a is None else float(a) for a in agg["per_position_acceptance"]],
            source=str(result.path), command=result.command,
            speedup_p10=_num(agg, "speedup.p10"), speedup_p90=_num(agg, "speedup.p90"),
            target_tokens_per_s=_num(agg, "target_tokens_per_s.median"), aggregate=agg))
        per_round = per_round_acceptance(wl.get("requests") or [], result.k)
        row = rows[-1]
        row.model_acceptance, row.model_acceptance_source = (
            (per_round, "requests, per round") if per_round is not None else (row.per_position, "aggregate"))
    return rows


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
    return (row.target, row.workload, _desc(row.acceptance_length), _desc(row.acceptance_rate), row.drafter, row.k,
            row.temperature, row.hardware, row.source)


def build_rows(results: list[Result]) -> list[Row]:
    """All rows of all results (none dropped, duplicates of a key kept), ordered, with speed ranks."""
    rows = sorted((row for r in results for row in rows_from_result(r)), key=order_key)
    assign_speed_ranks(rows)
    return rows


def assign_speed_ranks(rows: list[Row]) -> None:
    """speed_rank = 1 + number of rows with a higher speedup in the same (target, workload, hardware)."""
    groups: dict[tuple, list[Row]] = {}
    for row in rows:
        if row.speedup is not None:
            groups.setdefault((row.target, row.workload, row.hardware), []).append(row)
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


def model_tables(rows: list[Row], k_max: int = 8) -> tuple[list[ModelTable], list[str]]:
    """Speedup-model tables per setting, and notes for the settings that could not be modelled."""
    settings: dict[tuple, list[Row]] = {}
    for row in rows:
        settings.setdefault((row.target, row.drafter_kind, row.drafter, row.workload, row.temperature, row.hardware),
                            []).append(row)
    tables, notes = [], []
    for (target, _kind, drafter, workload, temp, hw), group in sorted(settings.items()):
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
        tables.append(ModelTable(target, drafter, workload, temp, hw, basis, costs, preds, sm.best_k(preds), measured))
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
