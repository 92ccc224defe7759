"""`draftsmith profile RUN`: the speedup profile an engine needs to decide when to speculate,
written to RUN/speedup_profile.json (beside the drafter; `draftsmith export` copies it).

    draftsmith profile runs/eagle3-stories260k/final --workloads mt_bench,gsm8k --k-max 6
    draftsmith profile runs/NAME/final --validate-batches 1,4,16      # predicted vs measured

What it measures, on this hardware:
  1. per-position acceptance per workload (batch-1 chain runs at k = k_max, greedy);
  2. the draft cost (propose per draft token, commit per round; same runs), and from one target-only
     and one speculative batch of --overhead-batch rows: the batched loop's own per-row cost per round
     and the drafting cost per row inside a batch (rows after the first draft with the drafter's
     weights still in cache: a later row costs 0.84-0.87 of the first for EAGLE-3 on Gemma-3-270M,
     one CPU core);
  3. the target's verification cost T(B, w, context) for B rows of w tokens each (tokens in flight
     B * w) over a grid of batch sizes, widths 1..k_max+1 and context lengths.
Model (Leviathan et al. 2023 sec. 3, per-position acceptance as in report/speedup_model.py; batched):
  E[tau](k)          = 1 + sum_{i<=k} prod_{j<=i} a_j
  draft(B, k)        = (k * propose + commit) * (1 + (B - 1) * rho)   (drafting runs row by row; rho = a
                       later row's cost over the first's, measured in the batch; 1 without that measurement)
  round(B, k, c)     = T(B, k+1, c) + draft(B, k) + B * overhead_spec
  step(B, c)         = T(B, 1, c) + B * overhead_target
  speedup(B, k, c)   = E[tau](k) * step(B, c) / round(B, k, c)
Then: the best k per batch size, the batch above which speculation stops paying (best k = 0), and,
with --validate-batches, the measured decode-phase speedup of batched runs (eval.runner.run_batched:
decoded tokens / decode wall time, prefills excluded as in the model) beside the prediction, with the
relative error.
"""
from __future__ import annotations

import datetime as _dt
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.eval import batch as batch_mod
from draftsmith.eval import workloads
from draftsmith.eval.loop import LoopConfig, clock, generate
from draftsmith.report import speedup_model
from draftsmith.report.speedup_model import PROFILE_FILE, PROFILE_SCHEMA, expected_tau

SCHEMA = PROFILE_SCHEMA


def _check_counts(repeats: int, k_max: int, num_prompts: int, max_new_tokens: int, overhead_batch: int) -> None:
    """Counts that must be positive (a negative --repeats measured nothing and divided by zero)."""
    for flag, value, low in (("--repeats", repeats, 1), ("--k-max", k_max, 1),
                             ("--num-prompts", num_prompts, 1), ("--max-new-tokens", max_new_tokens, 1),
                             ("--overhead-batch", overhead_batch, 1)):
        if value < low:
            raise UserError(f"{flag} {value}: must be >= {low}")


class _Timed:
    """Wraps a proposer and times its propose() (per draft token) and commit() calls."""

    def __init__(self, proposer):
        self.inner, self.name = proposer, getattr(proposer, "name", "proposer")
        self.propose_per_token: list[float] = []
        self.commit_s: list[float] = []

    def begin(self, prompt_ids):
        self.inner.begin(prompt_ids)
        self.in_prefill = True

    def commit(self, context, num_new, target_out):
        t0 = clock(context.device)
        self.inner.commit(context, num_new, target_out)
        if not self.in_prefill:  # the prefill's commit is not a round's
            self.commit_s.append(clock(context.device) - t0)
        self.in_prefill = False

    def propose(self, context, k, sampling, generator=None):
        t0 = clock(context.device)
        draft = self.inner.propose(context, k, sampling, generator)
        self.propose_per_token.append((clock(context.device) - t0) / max(1, k))
        return draft


def measure_acceptance(target, proposer, prompts: list[torch.Tensor], k_max: int, max_new: int) -> dict:
    """Batch-1 chain runs at k_max: per-position acceptance and the draft cost (propose per draft
    token; commit per round)."""
    accepted, reached = [0] * k_max, [0] * k_max
    timed, prompt_lens = _Timed(proposer), []
    for ids in prompts:
        spec = generate(target, timed, ids, LoopConfig(k=k_max, max_new_tokens=max_new))
        prompt_lens.append(ids.shape[0])
        for r in spec.rounds:
            for i in range(min(r.proposed, k_max)):
                reached[i] += i <= r.accepted
                accepted[i] += i < r.accepted
    return {"per_position": [a / n if n else None for a, n in zip(accepted, reached)],
            "prompt_tokens_mean": statistics.fmean(prompt_lens),
            "draft_step_s": _low(timed.propose_per_token), "draft_commit_s": _low(timed.commit_s)}


def measure_loop_overhead(target, proposer, prompts: list[torch.Tensor], B: int, k: int, max_new: int) -> dict:
    """From one batch of B requests (prompts reused cyclically), target-only and speculative at k: the
    batched loop's own cost per row and round ((round time - verify forward - drafting) / rows), and
    rho, what a row after the first costs to draft inside the batch (batch_draft_ratio)."""
    import copy

    from draftsmith.eval.loop import generate_batch

    ids = [prompts[i % len(prompts)] for i in range(B)]
    out = {}
    for label, kk in (("overhead_target_s", 0), ("overhead_spec_s", k)):
        gens = generate_batch(target, [copy.copy(proposer) if kk else None for _ in ids], ids,
                              LoopConfig(k=kk, max_new_tokens=max_new))
        samples = []
        for j in range(max(len(g.rounds) for g in gens)):
            rows = [g.rounds[j] for g in gens if len(g.rounds) > j]
            samples.append((rows[0].total_s - rows[0].verify_s - sum(r.draft_s for r in rows)) / len(rows))
        out[label] = _low(samples)
        if kk:
            out["batch_draft_ratio"] = batch_draft_ratio(gens)
    return out


def batch_draft_ratio(gens: list) -> float | None:
    """rho of the model, from one batched run's generations (one per row, in row order): per round, the
    mean drafting time (propose + commit) of rows 1..B-1 over row 0's, then the median over rounds.
    Row 0 drafts as a batch-1 round does (its commit right after the verification forward); the rows
    after it find the drafter's weights in cache. Only rounds where every row drafted the deepest draft
    the run saw and drafts again the next round count (a last round skips its commit; a cut draft costs
    less). None when no round qualifies or there is one row."""
    if len(gens) < 2:
        return None
    deepest = max((r.proposed for g in gens for r in g.rounds), default=0)
    ratios = []
    for j in range(min(len(g.rounds) for g in gens) - 1):  # every row has round j + 1
        rows = [g.rounds[j] for g in gens]
        if deepest and all(r.proposed == deepest for r in rows) and rows[0].draft_s > 0:
            ratios.append(statistics.fmean(r.draft_s for r in rows[1:]) / rows[0].draft_s)
    return statistics.median(ratios) if ratios else None


def _low(values: list[float]) -> float:
    """The 10th percentile: the cost without time-slicing by other processes."""
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), 0.1)) if values else 0.0


@torch.no_grad()
def measure_verify(target, batches: list[int], widths: list[int], contexts: list[int], repeats: int) -> list[dict]:
    """Seconds of one target forward of B rows x w new tokens after a context of c tokens, with the
    batched loop's 4D mask and position ids: the MINIMUM over repeats (on a shared machine a forward
    that gets time-sliced costs 3-15x more; the minimum is the unpreempted cost, and the loop's
    own costs use a low quantile for the same reason). Widths are timed round-robin within each
    repeat. `seconds` is the measured cost with time-sliced spikes removed (cost_envelope); raw minima
    and medians and the smooth fit (`seconds_fit`, fit_verify_cost) are kept."""
    from transformers import DynamicCache

    gen = torch.Generator().manual_seed(0)
    rows = []
    for c in contexts:
        for B in batches:
            cache = DynamicCache(config=target.config)
            ids = torch.randint(3, target.vocab_size, (B, c + max(widths)), generator=gen).to(target.device)
            target.forward(ids[:, :c], cache=cache)
            valid = torch.ones(B, c, dtype=torch.bool, device=target.device)
            inputs = {w: batch_mod.verify_inputs(valid, w, target.dtype) for w in widths}
            times: dict[int, list[float]] = {w: [] for w in widths}
            for rep in range(repeats + 1):  # the first round is a warm-up
                for w in widths:
                    mask, pos = inputs[w]
                    t0 = clock(target.device)
                    target.forward(ids[:, c:c + w], attention_mask=mask, cache=cache, position_ids=pos)
                    dt = clock(target.device) - t0
                    cache.crop(-w)
                    if rep:
                        times[w].append(dt)
            for w in widths:
                rows.append({"context": c, "batch": B, "width": w, "tokens_in_flight": B * w,
                             "seconds_raw_min": min(times[w]), "seconds_raw_median": statistics.median(times[w])})
    fit_verify_cost(rows)
    cost_envelope(rows)
    return rows


def fit_verify_cost(rows: list[dict], rounds: int = 4) -> list[float]:
    """Fit T = a + b*n + e*n*c + f*B (n = B*w tokens in flight, c context: fixed cost per forward,
    per token, attention per token and context, per row) to the raw minima, then set each row's
    `seconds` to the fit. Robust to time-slicing, whose outliers lie only ABOVE the true cost:
    1. least squares on RELATIVE error (each point's pull is bounded, so a 10x outlier cannot drag
       the fit), with non-negative coefficients (a negative one is dropped and the rest refitted);
    2. drop points above 1.5x the fitted value and refit, up to `rounds` times.
    Returns [a, b, e, f]."""
    def features(r):
        n = r["batch"] * r["width"]
        return [1.0, n, n * r["context"], r["batch"]]

    def solve(idx):
        X = torch.tensor([features(rows[i]) for i in idx], dtype=torch.float64)
        y = torch.tensor([rows[i]["seconds_raw_min"] for i in idx], dtype=torch.float64)
        active = list(range(4))
        while True:
            sol = torch.linalg.lstsq(X[:, active] / y[:, None], torch.ones_like(y)[:, None]).solution[:, 0]  # 1.
            if (sol >= 0).all() or len(active) == 1:
                coef = torch.zeros(4, dtype=torch.float64)
                coef[active] = sol.clamp_min(0.0)
                return coef, X @ coef, y
            active.pop(int(sol.argmin()))

    keep = list(range(len(rows)))
    for _ in range(rounds):  # 2.
        coef, pred, y = solve(keep)
        kept = [i for i, ok in zip(keep, (y <= 1.5 * pred).tolist()) if ok]
        if len(kept) < 4 or kept == keep:
            break
        keep = kept
    coef = solve(keep)[0]
    for r in rows:
        r["seconds_fit"] = r["seconds"] = float(torch.tensor(features(r), dtype=torch.float64) @ coef)
        r["fit_outlier"] = r["seconds_raw_min"] > 1.5 * r["seconds"]
    return coef.tolist()


def cost_envelope(rows: list[dict]) -> None:
    """Set each row's `seconds` to its measured minimum with time-sliced cells repaired, along the
    context axis only: the same B rows x w tokens after a longer context run the same matmuls plus a
    longer attention, so they cannot cost less. A row is capped by the same (B, w) at any longer
    context; a row at the longest context that costs over 1.5x the next shorter one's (scaled by the
    fit's ratio between the two contexts) was time-sliced and takes that scaled value.
    Across B and w nothing is smoothed: kernels change with the shape (one float32 core here: 1-3
    tokens 0.10 s, 4-6 tokens 0.19 s; 4 rows x 3 tokens 0.37 s but 4 x 6 0.25 s, at every context),
    and the fit alone, which smoothed those steps away, predicted half of the real round (mt_bench at
    batch 1: 1.42x predicted, 0.78x measured)."""
    by_cell: dict[tuple[int, int], list[dict]] = {}
    for r in rows:
        by_cell.setdefault((r["batch"], r["width"]), []).append(r)
    for cell in by_cell.values():
        cell.sort(key=lambda r: r["context"])
        for i, r in enumerate(cell):
            r["seconds"] = min(o["seconds_raw_min"] for o in cell[i:])
        if len(cell) > 1:
            last, prev = cell[-1], cell[-2]
            scaled = prev["seconds_raw_min"] * last["seconds_fit"] / max(prev["seconds_fit"], 1e-12)
            if last["seconds_raw_min"] > 1.5 * scaled:
                last["seconds"] = scaled


def verify_cost(table: list[dict], B: int, w: int, context: float) -> float:
    """T(B, w, context) from the grid's `seconds` (cost_envelope): exact B and w, linear in context between
    measured ones (the nearest measured context outside them)."""
    pts = sorted((r["context"], r["seconds"]) for r in table if r["batch"] == B and r["width"] == w)
    if not pts:
        raise KeyError(f"no verify cost measured for batch {B}, width {w}")
    if context <= pts[0][0]:
        return pts[0][1]
    for (c0, t0), (c1, t1) in zip(pts, pts[1:]):
        if c0 <= context <= c1:
            return t0 + (t1 - t0) * (context - c0) / (c1 - c0)
    return pts[-1][1]


def predict(acc: dict, table: list[dict], B: int, k: int, context: float) -> dict:
    """speedup(B, k, context) of the module docstring's model."""
    step = verify_cost(table, B, 1, context) + B * acc["overhead_target_s"]
    if k == 0:
        return {"batch": B, "k": 0, "expected_tau": 1.0, "speedup": 1.0}
    tau, _ = expected_tau([a if a is not None else float("nan") for a in acc["per_position"]], k)
    first = k * acc["draft_step_s"] + acc.get("draft_commit_s", 0.0)  # one row's drafting, as at batch 1
    rho = acc.get("batch_draft_ratio")
    draft = first * (1 + (B - 1) * (1.0 if rho is None else rho))  # every row's, row by row
    rnd = verify_cost(table, B, k + 1, context) + draft + B * acc["overhead_spec_s"]
    return {"batch": B, "k": k, "expected_tau": tau, "speedup": tau * step / rnd}


def recommend(acc: dict, table: list[dict], batches: list[int], k_max: int, context: float) -> dict:
    best = {}
    for B in batches:
        preds = [predict(acc, table, B, k, context) for k in range(k_max + 1)]
        top = speedup_model.best(preds, lambda p: p["speedup"], lambda p: p["k"])  # the one tie-break
        best[str(B)] = {"k": top["k"], "speedup": top["speedup"]}
    stops = [B for B in batches if best[str(B)]["k"] == 0]
    return {"context": context, "best_k_by_batch": best,
            "speculation_stops_paying_at_batch": min(stops) if stops else None}


def run(path: str | Path, workload_names: list[str] = ("mt_bench", "gsm8k"), k_max: int = 6, num_prompts: int = 8,
        max_new_tokens: int = 64, batches: list[int] = (1, 2, 4, 8, 16, 32), contexts: list[int] = (64, 256),
        repeats: int = 10, overhead_batch: int = 8, validate_batches: list[int] = (), device: str = "auto",
        out: Path | None = None) -> dict:
    """Measure and write a checkpoint's speedup profile (the module docstring) to `out` (default
    PATH/speedup_profile.json); returns the profile. `draftsmith profile` calls this with its flags."""
    from draftsmith.checkpoint import load_drafter
    from draftsmith.core import files
    from draftsmith.core.bounds import check_batch_sizes, check_draft_tokens
    from draftsmith.eval import proposers, results, runner

    _check_counts(repeats, k_max, num_prompts, max_new_tokens, overhead_batch)
    check_draft_tokens(k_max, "--k-max")  # before anything loads: --k-max 100000000 would run for days
    for flag, sizes in (("--batches", batches), ("--validate-batches", validate_batches),
                        ("--overhead-batch", [overhead_batch])):
        check_batch_sizes(list(sizes), flag)  # --batches 1000000000 asked for 568 GB
    out = files.check_output_file(out or Path(path) / PROFILE_FILE, "--out")  # never a device node or FIFO
    batches, contexts, validate = list(batches), list(contexts), list(validate_batches)
    names = workloads.expand([w.strip() for w in workload_names if w.strip()])
    loaded = load_drafter(path, device=None if device == "auto" else device, check_profile=False)  # it rewrites it
    target, proposer = loaded.target, proposers.from_drafter(loaded.drafter, loaded.target)
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and max(contexts) + k_max + 1 > limit:
        raise UserError(f"--contexts {contexts}: the largest plus k_max + 1 exceeds the target's {limit} positions")
    print(f"[profile] verify cost grid: batches {batches}, widths 1..{k_max + 1}, contexts {contexts}", flush=True)
    table = measure_verify(target, sorted(set(batches + validate)), list(range(1, k_max + 2)), contexts, repeats)
    # prompted as `draftsmith eval` prompts this checkpoint: in the format its drafter was trained with
    prompt_format = workloads.training_prompt_format(workloads.checkpoint_recipe(path), target.tokenizer)
    print(f"[profile] prompt format: {prompt_format} (as in training)", flush=True)
    acceptance, recs, predicted, checks = {}, {}, [], []
    for name in names:
        items = workloads.load(name, None, num_prompts)
        prompts = [workloads.encode(it, target.tokenizer, prompt_format, (limit or 10**9) - max_new_tokens)[0]
                   for it in items]
        print(f"[profile] {name}: acceptance at k = {k_max} over {len(prompts)} prompts", flush=True)
        acc = measure_acceptance(target, proposer, prompts, k_max, max_new_tokens)
        acc.update(measure_loop_overhead(target, proposer, prompts, overhead_batch, k_max, max_new_tokens))
        if acc["batch_draft_ratio"] is None:
            print(f"[profile] {name}: no full batched round to time later rows' drafting: every row is charged a "
                  "batch-1 round's drafting (rho = 1)", flush=True)
        acc["cost_statistic"] = "10th percentile of per-call / per-round samples (unpreempted cost on a shared machine)"
        acceptance[name] = acc
        ctx = acc["prompt_tokens_mean"] + max_new_tokens / 2  # the mean context of a decode round
        recs[name] = recommend(acc, table, batches, k_max, ctx)
        for c in contexts:
            predicted += [{"workload": name, "context": c, **predict(acc, table, B, k, c)}
                          for B in batches for k in range(k_max + 1)]
        if validate:
            k_val = max(1, recs[name]["best_k_by_batch"][str(min(batches))]["k"])
            # the measured runs take the prompts in the format the acceptance above was measured in
            s = runner.EvalSettings(k=k_val, max_new_tokens=max_new_tokens, num_prompts=num_prompts,
                                    warmup=1, seed=0, check_lossless=False, prompt_format=prompt_format)
            for row in runner.run_batched(target, proposer, name, s, validate):
                p = predict(acc, table, row["batch_size"], k_val, ctx)["speedup"]
                m = row["decode_speedup"]
                checks.append({"workload": name, "batch": row["batch_size"], "k": k_val, "predicted": p,
                               "measured": m, "relative_error": (p - m) / m, "measured_tau": row["acceptance_length"],
                               "measured_end_to_end": row["speedup"]})
    first = recs[names[0]]["best_k_by_batch"][str(min(batches))]
    profile = {
        "schema": SCHEMA, "schema_version": 1,
        "created": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": "draftsmith profile " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
        "drafter": {"kind": loaded.drafter.kind, "path": str(path)}, "target": target.identity(),
        "hardware": results.hardware(target.device), "software": results.software(),
        "model": "speedup(B,k,c) = E[tau](k) * (T(B,1,c) + B*o_t) / (T(B,k+1,c) + (k*d + commit)*(1 + (B-1)*rho) + B*o_s); see draftsmith/eval/profile.py",
        "settings": {"k_max": k_max, "max_new_tokens": max_new_tokens, "num_prompts": num_prompts,
                     "workloads": names, "batches": batches, "contexts": contexts, "repeats": repeats,
                     "threads": torch.get_num_threads(), "prompt_format": prompt_format},
        "acceptance": acceptance, "verify_cost": table, "predicted": predicted, "recommendation": recs,
        "recommended_num_speculative_tokens": first["k"], "speculation_pays_at_batch_1": first["k"] > 0,
        "validation": checks,
        "validation_error": {"mean_abs_relative": statistics.fmean(abs(c["relative_error"]) for c in checks)} if checks else None,
    }
    results.write_text_atomically(Path(out), json.dumps(results._clean(profile), indent=1) + "\n")
    print(summary(profile))
    print(f"[profile] written to {out}")
    return profile


def summary(profile: dict) -> str:
    lines = []
    for name, rec in profile["recommendation"].items():
        best = ", ".join(f"B={b}: k={v['k']} ({v['speedup']:.2f}x)" for b, v in rec["best_k_by_batch"].items())
        lines.append(f"{name} (context ~{rec['context']:.0f}): best k per batch {best}")
        stop = rec["speculation_stops_paying_at_batch"]
        lines.append(f"  speculation stops paying at batch {stop}" if stop else "  speculation pays at every batch profiled")
    if not profile["speculation_pays_at_batch_1"]:
        lines.append("speculation does not pay here: the best choice at batch 1 is k = 0 (target-only decoding)")
    for c in profile["validation"]:
        lines.append(f"validation {c['workload']} B={c['batch']} k={c['k']}: predicted {c['predicted']:.2f}x "
                     f"measured {c['measured']:.2f}x (error {c['relative_error']:+.0%})")
    if profile["validation_error"]:
        lines.append(f"mean |relative error| {profile['validation_error']['mean_abs_relative']:.0%}")
    return "\n".join(lines)
