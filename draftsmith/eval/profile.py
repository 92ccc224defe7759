"""`draftsmith profile RUN`: the speedup profile an engine needs to decide when to speculate,
written to RUN/speedup_profile.json (beside the drafter; `draftsmith export` copies it).

    draftsmith profile runs/eagle3-stories260k/final --workloads mt_bench,gsm8k --k-max 6
    draftsmith profile runs/NAME/final --validate-batches 1,4,16      # predicted vs measured

What it measures, on this hardware:
  1. per-position acceptance per workload (batch-1 chain runs at k = k_max, greedy);
  2. the draft cost per draft token and the loop's per-row overhead per round (same runs);
  3. the target's verification cost T(B, w, context) for B rows of w tokens each (tokens in flight
     B * w) over a grid of batch sizes, widths 1..k_max+1 and context lengths.
Model (Leviathan et al. 2023 sec. 3, per-position acceptance as in report/speedup_model.py; batched):
  E[tau](k)          = 1 + sum_{i<=k} prod_{j<=i} a_j
  round(B, k, c)     = T(B, k+1, c) + B * (k * draft_step + overhead_spec)   (drafting runs row by row)
  step(B, c)         = T(B, 1, c) + B * overhead_target
  speedup(B, k, c)   = E[tau](k) * step(B, c) / round(B, k, c)
Then: the best k per batch size, the batch above which speculation stops paying (best k = 0), and,
with --validate-batches, the measured decode-phase speedup of batched runs (eval.runner.run_batched:
decoded tokens / decode wall time, prefills excluded as in the model) beside the prediction, with the
relative error.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import statistics
import sys
from pathlib import Path

import torch

from draftsmith.eval import batch as batch_mod
from draftsmith.eval import workloads
from draftsmith.eval.loop import LoopConfig, _clock, generate
from draftsmith.report.speedup_model import expected_tau

PROFILE_FILE = "speedup_profile.json"
SCHEMA = "draftsmith.speedup-profile"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a training checkpoint dir (runs/NAME/final); the profile is written there")
    p.add_argument("--workloads", default="mt_bench,gsm8k", help="comma-separated workload names")
    p.add_argument("--k-max", type=int, default=6, help="deepest draft length profiled")
    p.add_argument("--num-prompts", type=int, default=8, help="per workload, for acceptance")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes of the verify-cost grid and predictions")
    p.add_argument("--contexts", default="64,256", help="context lengths of the verify-cost grid")
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per grid point (minimum)")
    p.add_argument("--validate-batches", default="", help="e.g. 1,4,16: measure batched runs and state the error")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None, help=f"default: PATH/{PROFILE_FILE}")


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"{flag} {text!r}: give comma-separated integers, e.g. 1,4,16") from None
    if any(v < 1 for v in out):
        raise SystemExit(f"{flag} {text!r}: values must be >= 1")
    return out


def measure_acceptance(target, proposer, prompts: list[torch.Tensor], k_max: int, max_new: int) -> dict:
    """Batch-1 chain runs at k_max: per-position acceptance, draft cost per token, per-row overheads."""
    accepted, reached = [0] * k_max, [0] * k_max
    draft_step, over_spec, over_base, prompt_lens = [], [], [], []
    for ids in prompts:
        base = generate(target, None, ids, LoopConfig(k=0, max_new_tokens=max_new))
        spec = generate(target, proposer, ids, LoopConfig(k=k_max, max_new_tokens=max_new))
        prompt_lens.append(ids.shape[0])
        over_base += [r.overhead_s for r in base.rounds]
        for r in spec.rounds:
            over_spec.append(r.overhead_s)
            if r.proposed:
                draft_step.append(r.draft_s / r.proposed)
            for i in range(min(r.proposed, k_max)):
                reached[i] += i <= r.accepted
                accepted[i] += i < r.accepted
    return {"per_position": [a / n if n else None for a, n in zip(accepted, reached)],
            "prompt_tokens_mean": statistics.fmean(prompt_lens),
            "draft_step_s": _low(draft_step), "overhead_spec_s": _low(over_spec), "overhead_target_s": _low(over_base),
            "cost_statistic": "10th percentile of per-round samples (unpreempted cost on a shared machine)"}


def _low(values: list[float]) -> float:
    """The 10th percentile: the cost without time-slicing by other processes."""
    return float(torch.quantile(torch.tensor(values, dtype=torch.float64), 0.1)) if values else 0.0


@torch.no_grad()
def measure_verify(target, batches: list[int], widths: list[int], contexts: list[int], repeats: int) -> list[dict]:
    """Seconds of one target forward of B rows x w new tokens after a context of c tokens, with the
    batched loop's 4D mask and position ids: the MINIMUM over repeats (on a shared machine a forward
    that gets time-sliced costs 3-5x more; the minimum is the unpreempted cost, and the loop's
    own costs below use a low quantile for the same reason). Widths are timed round-robin within
    each repeat; `seconds` is made non-decreasing in w (raw minima and medians are kept)."""
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
                    t0 = _clock(target.device)
                    target.forward(ids[:, c:c + w], attention_mask=mask, cache=cache, position_ids=pos)
                    dt = _clock(target.device) - t0
                    cache.crop(-w)
                    if rep:
                        times[w].append(dt)
            running = 0.0
            for w in widths:
                running = max(running, min(times[w]))
                rows.append({"context": c, "batch": B, "width": w, "tokens_in_flight": B * w, "seconds": running,
                             "seconds_raw_min": min(times[w]), "seconds_raw_median": statistics.median(times[w])})
    return rows


def verify_cost(table: list[dict], B: int, w: int, context: float) -> float:
    """T(B, w, context) from the grid: exact B and w, linear in context between measured ones
    (the nearest measured context outside them)."""
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
    rnd = verify_cost(table, B, k + 1, context) + B * (k * acc["draft_step_s"] + acc["overhead_spec_s"])
    return {"batch": B, "k": k, "expected_tau": tau, "speedup": tau * step / rnd}


def recommend(acc: dict, table: list[dict], batches: list[int], k_max: int, context: float) -> dict:
    best = {}
    for B in batches:
        preds = [predict(acc, table, B, k, context) for k in range(k_max + 1)]
        top = max(preds, key=lambda p: (p["speedup"], -p["k"]))
        best[str(B)] = {"k": top["k"], "speedup": top["speedup"]}
    stops = [B for B in batches if best[str(B)]["k"] == 0]
    return {"context": context, "best_k_by_batch": best,
            "speculation_stops_paying_at_batch": min(stops) if stops else None}


def main(args: argparse.Namespace) -> int:
    from draftsmith.eval import proposers, results, runner
    from draftsmith.train.checkpoint import load_drafter

    batches, contexts = _ints(args.batches, "--batches"), _ints(args.contexts, "--contexts")
    validate = _ints(args.validate_batches, "--validate-batches") if args.validate_batches else []
    names = workloads.expand([w.strip() for w in args.workloads.split(",") if w.strip()])
    loaded = load_drafter(args.path, device=None if args.device == "auto" else args.device)
    target, proposer = loaded.target, proposers.from_drafter(loaded.drafter, loaded.target)
    limit = getattr(target.config, "max_position_embeddings", None)
    if limit is not None and max(contexts) + args.k_max + 1 > limit:
        raise SystemExit(f"--contexts {args.contexts}: the largest plus k_max + 1 exceeds the target's {limit} positions")
    print(f"[profile] verify cost grid: batches {batches}, widths 1..{args.k_max + 1}, contexts {contexts}", flush=True)
    table = measure_verify(target, sorted(set(batches + validate)), list(range(1, args.k_max + 2)), contexts, args.repeats)
    acceptance, recs, predicted, checks = {}, {}, [], []
    for name in names:
        items = workloads.load(name, None, args.num_prompts)
        prompts = [workloads.encode(it, target.tokenizer, "auto", (limit or 10**9) - args.max_new_tokens)[0] for it in items]
        print(f"[profile] {name}: acceptance at k = {args.k_max} over {len(prompts)} prompts", flush=True)
        acc = measure_acceptance(target, proposer, prompts, args.k_max, args.max_new_tokens)
        acceptance[name] = acc
        ctx = acc["prompt_tokens_mean"] + args.max_new_tokens / 2  # the mean context of a decode round
        recs[name] = recommend(acc, table, batches, args.k_max, ctx)
        for c in contexts:
            predicted += [{"workload": name, "context": c, **predict(acc, table, B, k, c)}
                          for B in batches for k in range(args.k_max + 1)]
        if validate:
            k_val = max(1, recs[name]["best_k_by_batch"][str(min(batches))]["k"])
            s = runner.EvalSettings(k=k_val, max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts,
                                    warmup=1, seed=0, check_lossless=False)
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
        "drafter": {"kind": loaded.drafter.kind, "path": str(args.path)}, "target": target.identity(),
        "hardware": results.hardware(target.device), "software": results.software(),
        "model": "speedup(B,k,c) = E[tau](k) * (T(B,1,c) + B*o_t) / (T(B,k+1,c) + B*(k*d + o_s)); see draftsmith/eval/profile.py",
        "settings": {"k_max": args.k_max, "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts,
                     "workloads": names, "batches": batches, "contexts": contexts, "repeats": args.repeats,
                     "threads": torch.get_num_threads()},
        "acceptance": acceptance, "verify_cost": table, "predicted": predicted, "recommendation": recs,
        "recommended_num_speculative_tokens": first["k"], "speculation_pays_at_batch_1": first["k"] > 0,
        "validation": checks,
        "validation_error": {"mean_abs_relative": statistics.fmean(abs(c["relative_error"]) for c in checks)} if checks else None,
    }
    out = args.out or Path(args.path) / PROFILE_FILE
    out.write_text(json.dumps(results._clean(profile), indent=1) + "\n")
    print(summary(profile))
    print(f"[profile] written to {out}")
    return 0


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
