"""Parallel (single-forward) drafters against EAGLE-3 on stories260K, same training budget.

Each kind trains from its debug recipe (recipes/debug/<kind>-stories260k.yaml; the same steps,
batch, lr and target-regenerated Alpaca answers), then runs through `draftsmith eval` on the same
held-out prompts (MT-bench and GSM8K), greedy, k = 5, lossless check on. Reported per kind: tau,
draft time per round (ms; steps 1 + 5 of the loop), speedup over target-only decoding, and that
speedup relative to EAGLE-3's. A kind whose results JSON already exists in --out is not rerun
(delete it to rerun), so kinds can be added one at a time against the same EAGLE-3 run.

The eval runs of different kinds happen at different times, so on a shared machine their clocks
see different loads. The timing table therefore comes from a second phase that loads every trained
kind and, prompt by prompt, runs target-only decoding and each kind back to back (order rotating),
--timing-repeats times: draft ms per round and speedup are medians over those interleaved runs.

    OMP_NUM_THREADS=2 python benchmarks/bench_parallel_drafters.py                       # all kinds
    OMP_NUM_THREADS=2 python benchmarks/bench_parallel_drafters.py --kinds eagle3,dflash --steps 300
    python benchmarks/bench_parallel_drafters.py --kinds dflash --steps 20 --num-prompts 2   # smoke run
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_drafter_kinds import REPO, arguments, evaluate, train_kind  # noqa: E402

KINDS = ["eagle3", "dflash", "dspark", "peagle"]


def row(kind: str, res: dict, workload: str) -> dict:
    agg = res["workloads"][workload]["aggregate"]
    return {"tau": agg["acceptance_length"]["mean"], "draft_ms": 1e3 * agg["time_per_round_s"]["draft"],
            "speedup": agg["speedup"]["median"], "lossless": all(r["lossless"] for r in res["workloads"][workload]["requests"])}


def interleaved_timing(kinds: list[str], args) -> dict:
    """-> {kind: {"draft_ms": median per round, "speedup": median over (prompt, repeat) of target-only
    latency / speculative latency, "tau": mean}} from runs interleaved prompt by prompt."""
    import torch

    from draftsmith import checkpoint
    from draftsmith.eval import workloads
    from draftsmith.eval.loop import LoopConfig, generate

    loaded = {k: checkpoint.load_drafter(args.out / "runs" / k / "final", device="cpu") for k in kinds}
    target = next(iter(loaded.values())).target
    proposers = {k: ld.drafter.eval().make_proposer(ld.target) for k, ld in loaded.items()}
    # prompted as `draftsmith eval` prompts each checkpoint: in the format its drafter was trained with
    formats = {workloads.training_prompt_format(workloads.checkpoint_recipe(args.out / "runs" / k / "final"), target.tokenizer)
               for k in kinds}
    if len(formats) != 1:
        raise SystemExit(f"the kinds were trained on different prompt formats {sorted(formats)}; time them separately")
    prompt_format = formats.pop()
    prompts = [workloads.encode(item, target.tokenizer, prompt_format)[0] for w in args.workloads.split(",")
               for item in workloads.load(w, num_prompts=args.num_prompts)]
    cfg, base_cfg = LoopConfig(k=args.k, max_new_tokens=args.max_new_tokens), LoopConfig(k=0, max_new_tokens=args.max_new_tokens)
    draft, speed, taus = ({k: [] for k in kinds} for _ in range(3))
    order = ["target", *kinds]
    with torch.no_grad():
        generate(target, None, prompts[0], base_cfg)  # warm-up
        for rep in range(args.timing_repeats):
            for i, ids in enumerate(prompts):
                shift = (rep + i) % len(order)
                latency = {}
                for name in order[shift:] + order[:shift]:
                    g = generate(target, None if name == "target" else proposers[name], ids,
                                 base_cfg if name == "target" else cfg)
                    latency[name] = g.latency_s / len(g.tokens)
                    if name != "target":
                        draft[name] += [r.draft_s for r in g.rounds if r.proposed]
                        taus[name].append(sum(r.committed for r in g.rounds) / max(1, len(g.rounds)))
                for k in kinds:
                    speed[k].append(latency["target"] / latency[k])
    return {k: {"draft_ms": 1e3 * statistics.median(draft[k]), "speedup": statistics.median(speed[k]),
                "tau": statistics.fmean(taus[k])} for k in kinds}


def main() -> None:
    p = arguments(__doc__, KINDS, REPO / "runs" / "bench-parallel")
    p.add_argument("--timing-repeats", type=int, default=3, help="interleaved timing passes (0: skip)")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    walls = json.loads((args.out / "train_wall.json").read_text()) if (args.out / "train_wall.json").exists() else {}
    for kind in [k for k in args.kinds.split(",") if k]:
        out_json = args.out / f"{kind}.json"
        if out_json.exists():
            continue
        ckpt, wall, _ = train_kind(kind, args.steps, args.out)
        walls_file = args.out / "train_wall.json"  # re-read: another invocation may have added a kind meanwhile
        walls = {**(json.loads(walls_file.read_text()) if walls_file.exists() else {}), kind: wall}
        walls_file.write_text(json.dumps(walls))
        evaluate([str(ckpt)], out_json, args)
    results = {k: json.loads((args.out / f"{k}.json").read_text()) for k in KINDS if (args.out / f"{k}.json").exists()}
    print(f"\nstories260K, greedy, k={args.k}, {args.num_prompts} prompts per workload, {args.max_new_tokens} new tokens, "
          f"{args.steps} training steps")
    for w in args.workloads.split(","):
        base = row("eagle3", results["eagle3"], w)["speedup"] if "eagle3" in results else float("nan")
        print(f"\n{w}: kind | train s | tau mean | draft ms/round | speedup median | vs EAGLE-3 | lossless")
        for kind, res in results.items():
            r = row(kind, res, w)
            print(f"| {kind} | {walls.get(kind, float('nan')):.0f} | {r['tau']:.2f} | {r['draft_ms']:.2f} | "
                  f"{r['speedup']:.2f} | {r['speedup'] / base:.2f} | {r['lossless']} |")
    if args.timing_repeats > 0:
        timing = interleaved_timing(list(results), args)
        (args.out / "timing.json").write_text(json.dumps(timing, indent=1))
        base = timing.get("eagle3", {}).get("speedup", float("nan"))
        print(f"\ninterleaved timing ({args.timing_repeats} passes over the same prompts, greedy, k={args.k}):")
        print("| kind | tau | draft ms / round (median) | speedup (median) | vs EAGLE-3 |")
        for kind, t in timing.items():
            print(f"| {kind} | {t['tau']:.2f} | {t['draft_ms']:.2f} | {t['speedup']:.2f} | {t['speedup'] / base:.2f} |")


if __name__ == "__main__":
    main()
