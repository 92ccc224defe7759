"""The learning curve of a training run: held-out acceptance per draft position against training tokens
seen, a fitted curve with its uncertainty, and what more tokens would buy (`draftsmith plan`, and the
line `train` prints at each held-out evaluation).

    points = read_points(Path("runs/NAME"))          # from runs/NAME/metrics.jsonl
    plan = make_plan(points, k=3, goal_tau=2.0)
    print(plan_line(plan))

Data: each metrics.jsonl record of a held-out evaluation has `eval_acc_i` (the drafter's held-out
accuracy at draft position i, or `eval_<workload>/acc_i` on a workload's prompts with train.workload_eval,
which read_points(run, workload) reads; for a chain drafter trained with training-time test, step i of the
teacher-forced unroll, which stands for the conditional acceptance a_i) and `tokens_seen` (the
training tokens, padding excluded, that went in before it). Training speed is the median of the
logged `tokens_per_s_total`.

Curve, fitted per position i (x = tokens seen, in millions):
    acc_i(x) = a - b * x ** (-c),  a <= 1, b >= 0, 0 < c <= 2
  1. for each c on a grid, a and b are the weighted least-squares solution (linear in a, b; with a
     held at 1 when the free solution passes it); the c with the smallest weighted squared error wins
     (a saturating power law: a is where the curve flattens). Point j weighs (x_j / x_last) ** 2: the
     first evaluations fall in the start-up of training (a random layer, the warm-up), which follows no
     power law, and the fit is for extrapolating. Measured (docs/benchmarks.md "plan's curve forms"):
     predicting the end of 22 runs from their first third, within 0.03 on 19 weighted, 16 unweighted;
  2. uncertainty: a residual bootstrap (the fitted curve plus resampled residuals, refitted 200
     times); a prediction's interval is the 10th to 90th percentile of the refits.
  The last position's curve serves positions beyond the logged ones (marked extrapolated, as in
  report/speedup_model.py).
Chain: tau(k) = 1 + sum_{i<k} prod_{j<=i} acc_j (report/speedup_model.expected_tau).
Goal: the tokens at which the fitted tau(k) reaches the goal, found by bisection; "flattened" when
the goal lies above the curve's ceiling (tau at x -> infinity, its upper interval included) or a
doubling of tokens adds less than FLAT_GAIN to acc_0.
"""
from __future__ import annotations

import json
import math
import os
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

from draftsmith.core.errors import UserError
from draftsmith.core.files import MAX_RESULT_BYTES, read_received_text
from draftsmith.report.speedup_model import expected_tau

METRICS_FILE = "metrics.jsonl"
MIN_POINTS = 4          # three parameters per curve plus one degree of freedom
C_GRID = [0.02 * i for i in range(1, 101)]  # exponent c in (0, 2]
WEIGHT_POWER = 2        # point j weighs (tokens_j / tokens_last) ** 2 in the fit (module docstring, 1.)
BOOTSTRAP = 200
FLAT_GAIN = 0.005       # acc_0 gained by doubling the tokens below which the curve has flattened
MAX_FACTOR = 1e4        # the goal search stops at 10,000x the tokens seen
MAX_LOG_BYTES = 4 * MAX_RESULT_BYTES  # 256 MiB: about 400,000 logged steps


@dataclass(frozen=True)
class Point:
    step: int
    tokens: float                 # training tokens seen before this evaluation
    acc: tuple[float, ...]        # held-out acc_0, acc_1, ...


@dataclass(frozen=True)
class Curve:
    """acc(x) = a - b * x ** -c with x in millions of tokens; `boot` holds the bootstrap refits."""
    a: float
    b: float
    c: float
    rmse: float
    boot: tuple[tuple[float, float, float], ...] = ()

    def at(self, tokens: float) -> float:
        return _value(self.a, self.b, self.c, tokens)

    def interval(self, tokens: float) -> tuple[float, float]:
        """10th and 90th percentile of the bootstrap refits at `tokens` (the point value without refits)."""
        values = sorted(_value(a, b, c, tokens) for a, b, c in self.boot) or [self.at(tokens)]
        return values[int(0.1 * (len(values) - 1))], values[int(0.9 * (len(values) - 1))]


@dataclass
class Plan:
    points: list[Point]
    curves: list[Curve]
    tokens_per_s: Optional[float]
    k_values: list[int]
    tau_now: dict[int, float]              # fitted tau(k) at the last point's tokens
    tau_measured: dict[int, float]         # tau(k) from the last point's measured acc
    tau_ceiling: dict[int, float]          # tau(k) as tokens -> infinity (the curves' a)
    acc0_next: tuple[float, float, float]  # acc_0 at 2x the tokens seen: value, low, high
    flattened: bool
    k: int = 3                             # the k of the one-line summary and of the goal
    goal_tau: Optional[float] = None
    goal_k: Optional[int] = None
    goal_tokens: Optional[float] = None    # total tokens at which the goal is reached (None: not within reach)
    goal_tokens_range: tuple[Optional[float], Optional[float]] = (None, None)
    speedup: dict[int, float] = field(default_factory=dict)  # predicted speedup of tau_now per k, when costs exist
    series: str = "held-out"               # what the points measure: the held-out rows, or a workload's name


def _value(a: float, b: float, c: float, tokens: float) -> float:
    x = max(tokens, 1.0) / 1e6
    return min(1.0, max(0.0, a - b * x ** (-c)))


# ------------------------------------------------------------------ reading
def read_points(run: Path, workload: Optional[str] = None) -> tuple[list[Point], Optional[float]]:
    """RUN/metrics.jsonl -> (held-out points in step order, median training tokens/s or None).
    workload: the points of that train.workload_eval workload (`eval_<workload>/acc_i`) instead.
    A torn line (a killed run's last) is skipped; a record whose eval or token values are not numbers
    is one line naming the file and line."""
    def key(i: int) -> str:
        return metric_name(workload, f"acc_{i}") if workload else f"eval_acc_{i}"

    run = Path(run)
    file = run if run.name == METRICS_FILE or (run.exists() and not run.is_dir()) else run / METRICS_FILE
    if not os.path.lexists(file):
        raise UserError(f"{file}: not found; `draftsmith plan` reads the metrics.jsonl that `draftsmith train` "
                        "writes in its train.output_dir: pass that run directory")
    text = read_received_text(file, "metrics log", MAX_LOG_BYTES)
    by_step: dict[int, Point] = {}
    speeds: list[float] = []
    logged: set[str] = set()  # the workloads this run evaluated on (named when `workload` is not one of them)
    for n, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue  # a torn line of a killed run
        if not isinstance(record, dict):
            continue
        speed = record.get("tokens_per_s_total")
        if finite_number(speed) and speed > 0:
            speeds.append(float(speed))
        logged.update(k[len("eval_"):-len("/acc_0")] for k in record if k.startswith("eval_") and k.endswith("/acc_0"))
        if key(0) not in record:
            continue
        accs, i = [], 0
        while key(i) in record:
            accs.append(record[key(i)])
            i += 1
        values = [record.get("step"), record.get("tokens_seen"), *accs]
        if record.get("tokens_seen") is None:
            raise UserError(f"{file}:{n}: a held-out evaluation without `tokens_seen` (a run from before draftsmith "
                            "logged it); `draftsmith plan` needs the tokens seen at each evaluation: train again")
        if not all(finite_number(v) for v in values) or not all(0 <= a <= 1 for a in accs) or values[1] < 0:
            raise UserError(f"{file}:{n}: step, tokens_seen and {key(0)[:-1]}* must be numbers (accuracies in 0..1), "
                            f"got {line[:120]!r}; the file is damaged")
        by_step[int(record["step"])] = Point(int(record["step"]), float(record["tokens_seen"]), tuple(map(float, accs)))
    points = sorted(by_step.values(), key=lambda p: p.step)
    if workload and not points:
        named = ", ".join(sorted(logged)) or "none (the run had no train.workload_eval)"
        raise UserError(f"{file}: no evaluation on workload {workload!r} is logged; the run's workloads: {named}")
    if not workload and not points and logged:
        raise UserError(f"{file}: this run logged no held-out evaluation, only its workloads' ({', '.join(sorted(logged))}); "
                        "pass --workload NAME")
    speeds.sort()
    return points, (speeds[len(speeds) // 2] if speeds else None)


def metric_key(name: str) -> str:
    """A workload name as it appears in metric names (`eval_<key>/acc_i`): letters, digits, '_' and '.'
    (spec_bench/qa -> spec_bench.qa); a jsonl:PATH workload by its file's stem (jsonl:/x/chats.jsonl -> chats)."""
    if name.startswith("jsonl:"):
        name = Path(name.split(":", 1)[1]).stem
    return re.sub(r"[^A-Za-z0-9_.]", ".", name)


def metric_name(name: str, metric: str) -> str:
    """The logged name of one workload's metric: metric_name("mt_bench", "acc_0") -> "eval_mt_bench/acc_0". The '/'
    is in no key and no drafter's metric name, so no workload's name meets the held-out rows' (eval_<metric>)."""
    return f"eval_{metric_key(name)}/{metric}"


def finite_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


# ------------------------------------------------------------------ fitting
def fit(xs: list[float], ys: list[float], bootstrap: int = BOOTSTRAP, seed: int = 0,
        power: float = WEIGHT_POWER) -> Curve:
    """The saturating power law of the module docstring through (tokens, acc) points."""
    a, b, c, rmse = _fit_once(xs, ys, power)
    rng = random.Random(seed)
    fitted = [_value(a, b, c, x) for x in xs]
    residuals = [y - f for y, f in zip(ys, fitted)]
    boot = []
    for _ in range(bootstrap):  # 2.
        ys_b = [f + rng.choice(residuals) for f in fitted]
        boot.append(_fit_once(xs, ys_b, power)[:3])
    return Curve(a, b, c, rmse, tuple(boot))


def point_weights(xs: list[float], power: float = WEIGHT_POWER) -> list[float]:
    """1.'s weight of each point: (tokens / the last point's tokens) ** power (0: every point alike)."""
    last = max(max(xs), 1.0)
    return [(max(x, 1.0) / last) ** power for x in xs]


def _fit_once(xs: list[float], ys: list[float], power: float = WEIGHT_POWER) -> tuple[float, float, float, float]:
    """(a, b, c, weighted rms error) of 1."""
    w = point_weights(xs, power)
    best = None
    for c in C_GRID:  # 1.
        u = [-(max(x, 1.0) / 1e6) ** (-c) for x in xs]  # y = a + b * u
        n, su, sy = sum(w), sum(wi * v for wi, v in zip(w, u)), sum(wi * y for wi, y in zip(w, ys))
        suu, suy = sum(wi * v * v for wi, v in zip(w, u)), sum(wi * v * y for wi, v, y in zip(w, u, ys))
        den = n * suu - su * su
        b = (n * suy - su * sy) / den if abs(den) > 1e-18 else 0.0
        b = max(b, 0.0)  # acceptance does not fall with more tokens in this model
        a = (sy - b * su) / n
        if a > 1.0:  # acceptance cannot pass 1: refit b with the ceiling at 1
            a, b = 1.0, max(0.0, sum(wi * v * (y - 1.0) for wi, v, y in zip(w, u, ys)) / max(suu, 1e-18))
        sse = sum(wi * (a + b * v - y) ** 2 for wi, v, y in zip(w, u, ys))
        if best is None or sse < best[3]:
            best = (a, b, c, sse)
    a, b, c, sse = best
    return a, b, c, math.sqrt(sse / sum(w))


# ------------------------------------------------------------------ planning
def make_plan(points: list[Point], tokens_per_s: Optional[float] = None, k_values: list[int] = (1, 2, 3, 4, 5),
              goal_tau: Optional[float] = None, goal_k: Optional[int] = None,
              speedup_at: Optional[Callable[[list[float], int], float]] = None, where: str = "the run",
              series: str = "held-out") -> Plan:
    """Fit each logged position's curve and predict tau, speedup and the tokens a tau goal needs.
    speedup_at(acceptance, k) -> predicted speedup (from a speedup profile or measured costs), or None.
    series: what the points measure ("held-out", or a workload's name), as the texts say it."""
    if len(points) < MIN_POINTS:
        raise UserError(f"{where}: {len(points)} {series} evaluation(s) logged; the curve needs at least {MIN_POINTS} "
                        "(set train.eval_every so that a run evaluates at least 4 times, e.g. train.max_steps / 6)")
    positions = min(len(p.acc) for p in points)
    xs = [p.tokens for p in points]
    if len(set(xs)) < 3:
        raise UserError(f"{where}: the {series} evaluations were logged at {len(set(xs))} distinct token counts; "
                        "the curve needs at least 3")
    curves = [fit(xs, [p.acc[i] for p in points], seed=i) for i in range(positions)]
    now = xs[-1]
    last = points[-1]

    def accs(tokens: float, which: Callable[[Curve, float], float] = Curve.at) -> list[float]:
        return [which(cv, tokens) for cv in curves]

    k_values = sorted(set(k_values))
    tau_now = {k: expected_tau(accs(now), k)[0] for k in k_values}
    tau_measured = {k: expected_tau(list(last.acc[:positions]), k)[0] for k in k_values}
    tau_ceiling = {k: expected_tau([min(1.0, max(0.0, cv.a)) for cv in curves], k)[0] for k in k_values}
    lo, hi = curves[0].interval(2 * now)
    acc0_next = (curves[0].at(2 * now), lo, hi)
    flattened = acc0_next[0] - curves[0].at(now) < FLAT_GAIN
    plan = Plan(points, curves, tokens_per_s, k_values, tau_now, tau_measured, tau_ceiling, acc0_next, flattened,
                k=goal_k or max(k_values), series=series)
    if speedup_at is not None:
        plan.speedup = {k: speedup_at(accs(now), k) for k in k_values}
    if goal_tau is not None:
        k = plan.k
        plan.goal_tau, plan.goal_k = goal_tau, k
        plan.goal_tokens = _tokens_for(lambda t: expected_tau(accs(t), k)[0], goal_tau, now)
        optimistic = _tokens_for(lambda t: expected_tau([cv.interval(t)[1] for cv in curves], k)[0], goal_tau, now)
        pessimistic = _tokens_for(lambda t: expected_tau([cv.interval(t)[0] for cv in curves], k)[0], goal_tau, now)
        plan.goal_tokens_range = (optimistic, pessimistic)
    return plan


def _tokens_for(tau_at: Callable[[float], float], goal: float, now: float) -> Optional[float]:
    """Smallest total tokens in [now, now * MAX_FACTOR] where tau_at reaches goal (tau_at rises with
    tokens), by bisection on log tokens; None when even the far end falls short."""
    if tau_at(now) >= goal:
        return now
    lo, hi = math.log(now), math.log(now * MAX_FACTOR)
    if tau_at(math.exp(hi)) < goal:
        return None
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tau_at(math.exp(mid)) < goal else (lo, mid)
    return math.exp(hi)


# ------------------------------------------------------------------ printing
def _tokens(n: float) -> str:
    return f"{n / 1e6:.3g}M" if n >= 1e5 else f"{n / 1e3:.3g}k"


def _hours(tokens: float, tokens_per_s: Optional[float]) -> str:
    if not tokens_per_s:
        return ""
    h = tokens / tokens_per_s / 3600
    return f" ({h:.2g} h at {tokens_per_s:.0f} tokens/s)" if h >= 0.1 else f" ({h * 60:.2g} min at {tokens_per_s:.0f} tokens/s)"


def plan_line(plan: Plan) -> str:
    """One line: the curve now, where it goes at twice the tokens, and the goal (train prints it)."""
    now = plan.points[-1].tokens
    k = plan.k
    v, lo, hi = plan.acc0_next
    text = (f"plan: {_tokens(now)} tokens, {plan.series} acc_0 {plan.points[-1].acc[0]:.3f} (fit {plan.curves[0].at(now):.3f}); "
            f"at {_tokens(2 * now)}: acc_0 {v:.3f} [{lo:.3f}, {hi:.3f}]; tau(k={k}) {plan.tau_now[k]:.2f} now, "
            f"ceiling {plan.tau_ceiling[k]:.2f}")
    if plan.flattened:
        text += "; the curve has flattened (doubling the tokens adds < 0.005 acc_0)"
    if plan.goal_tau is not None:
        text += "; " + goal_text(plan)
    return text


def goal_text(plan: Plan) -> str:
    now = plan.points[-1].tokens
    goal, k = plan.goal_tau, plan.goal_k
    if plan.goal_tokens is None:
        return (f"tau {goal:g} at k={k} is out of reach: the fitted curve flattens at tau {plan.tau_ceiling[k]:.2f} "
                f"(checked up to {MAX_FACTOR:g}x the tokens seen)")
    if plan.goal_tokens <= now:
        return f"tau {goal:g} at k={k} is reached already (fitted tau {plan.tau_now[k]:.2f})"
    more = plan.goal_tokens - now
    opt, pes = plan.goal_tokens_range
    span = f"{_tokens(opt) if opt else '?'} to {_tokens(pes) if pes else 'out of reach'}"
    return (f"tau {goal:g} at k={k} needs {_tokens(plan.goal_tokens)} tokens in all ({span}), "
            f"{_tokens(more)} more{_hours(more, plan.tokens_per_s)}")


def report(plan: Plan) -> str:
    """The table `draftsmith plan` prints: the points, each position's curve, tau and speedup per k, the goal."""
    lines = [f"{plan.series} acceptance against training tokens:",
             "  step   tokens   " + "  ".join(f"acc_{i}" for i in range(len(plan.curves)))]
    for p in plan.points:
        lines.append(f"  {p.step:>5} {_tokens(p.tokens):>8}   " + "  ".join(f"{a:.3f}" for a in p.acc[:len(plan.curves)]))
    lines.append("fit acc_i = a - b * (tokens/1M)^-c (10-90% bootstrap interval at 2x the tokens):")
    now = plan.points[-1].tokens
    for i, cv in enumerate(plan.curves):
        lo, hi = cv.interval(2 * now)
        lines.append(f"  acc_{i}: a {cv.a:.3f}  b {cv.b:.4f}  c {cv.c:.2f}  rmse {cv.rmse:.4f}  "
                     f"at {_tokens(2 * now)}: {cv.at(2 * now):.3f} [{lo:.3f}, {hi:.3f}]")
    lines.append(f"tau by k (positions past acc_{len(plan.curves) - 1} repeat its curve):")
    for k in plan.k_values:
        s = ""
        if k in plan.speedup:
            s = (f"  speedup {plan.speedup[k]:.2f}x" if math.isfinite(plan.speedup[k])
                 else "  speedup - (past the profile's k_max)")
        lines.append(f"  k={k}: measured {plan.tau_measured[k]:.2f}  fitted {plan.tau_now[k]:.2f}  "
                     f"ceiling {plan.tau_ceiling[k]:.2f}{s}")
    if not plan.speedup:
        unmeasured = ", or none that measured this workload" if plan.series != "held-out" else ""
        lines.append(f"  (no speedup: no speedup_profile.json in the run or its final/{unmeasured}; "
                     "run `draftsmith profile RUN/final`)")
    if plan.tokens_per_s:
        lines.append(f"training speed: {plan.tokens_per_s:.0f} tokens/s (median of the logged tokens_per_s_total)")
    lines.append(plan_line(plan))
    return "\n".join(lines)


def check_lines(plan: Plan, later: list[Point]) -> list[str]:
    """The fit's prediction against evaluations it did not see (`plan --upto-tokens`): one line each
    for the last of them, acc_i predicted [interval] against measured."""
    if not later:
        return []
    last = later[-1]
    lines = [f"check against the run's later evaluation at {_tokens(last.tokens)} tokens (step {last.step}), "
             "not used by the fit:"]
    for i, cv in enumerate(plan.curves):
        if i < len(last.acc):
            lo, hi = cv.interval(last.tokens)
            pred = cv.at(last.tokens)
            lines.append(f"  acc_{i}: predicted {pred:.3f} [{lo:.3f}, {hi:.3f}]  measured {last.acc[i]:.3f}  "
                         f"error {pred - last.acc[i]:+.3f}")
    return lines


def train_line(run: Path, k: int = 3) -> Optional[str]:
    """The plan line `train` prints after a held-out evaluation, or None while too few points exist
    (or the log cannot be read: training goes on)."""
    try:
        points, speed = read_points(run)
        if len(points) < MIN_POINTS or len({p.tokens for p in points}) < 3:
            return None
        return plan_line(make_plan(points, speed, k_values=[k]))
    except UserError:
        return None
