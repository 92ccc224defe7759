"""Acceptance length tau of chain vs tree drafting at equal verify budget (draft tokens verified
per round) on stories260K, greedy, every output checked against target-only decoding.

For each budget N: the chain drafts k = N tokens; the dynamic tree (EAGLE-2) expands top-K
children per node to depth D and keeps the N best nodes; the static tree is Medusa's sparse
tree over a prior (tree.prior_acceptance). Writes a JSON and a plot of tau against budget.

    python benchmarks/bench_tree.py runs/eagle3-stories260k/final          # ~10 min on 2 busy cores
    python benchmarks/bench_tree.py CKPT --budgets 4 8 --num-prompts 3     # smoke run
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from draftsmith.eval import proposers, workloads
from draftsmith.eval.loop import LoopConfig, generate
from draftsmith.eval.tree import TreeConfig


def tau(gens) -> float:
    rounds = [r for g in gens for r in g.rounds]
    return sum(r.committed for r in rounds) / len(rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("checkpoint")
    ap.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32])
    ap.add_argument("--depths", type=int, nargs="+", default=[4, 6, 8], help="dynamic tree depths tried")
    ap.add_argument("--topk", type=int, nargs="+", default=[2, 4], help="dynamic tree top-K tried")
    ap.add_argument("--workloads", default="mt_bench,gsm8k")
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", type=Path, default=Path("results/bench_tree.json"))
    ap.add_argument("--prompt-format", default="auto", choices=list(workloads.PROMPT_FORMATS),
                    help="auto: the format the drafter was trained with, as `draftsmith eval` does")
    args = ap.parse_args()
    from draftsmith.checkpoint import load_drafter

    loaded = load_drafter(args.checkpoint, device="cpu")
    target, proposer = loaded.target, proposers.from_drafter(loaded.drafter, loaded.target)
    prompt_format = args.prompt_format
    if prompt_format == "auto":
        prompt_format = workloads.training_prompt_format(workloads.checkpoint_recipe(args.checkpoint), target.tokenizer)
    print(f"prompt format: {prompt_format}", flush=True)
    prompts = []
    for name in args.workloads.split(","):
        for item in workloads.load(name, None, args.num_prompts):
            prompts.append(workloads.encode(item, target.tokenizer, prompt_format, 512 - args.max_new_tokens)[0])
    base = [generate(target, None, ids, LoopConfig(k=0, max_new_tokens=args.max_new_tokens)).tokens for ids in prompts]

    def run(cfg: LoopConfig) -> dict:
        start = time.perf_counter()
        gens = [generate(target, proposer, ids, cfg) for ids in prompts]
        lossless = all(g.tokens == b for g, b in zip(gens, base))
        per_req = [sum(r.committed for r in g.rounds) / len(g.rounds) for g in gens]
        return {"tau": tau(gens), "tau_median_request": statistics.median(per_req), "lossless": lossless,
                "rounds": sum(len(g.rounds) for g in gens), "wall_s": time.perf_counter() - start}

    rows = []
    for n in args.budgets:
        row = {"budget": n, "chain": run(LoopConfig(k=n, max_new_tokens=args.max_new_tokens))}
        best = None
        for d in args.depths:
            for kk in args.topk:
                if d > n:
                    continue
                r = run(LoopConfig(k=d, max_new_tokens=args.max_new_tokens, tree=TreeConfig("dynamic", d, kk, n)))
                row[f"dynamic_d{d}_k{kk}"] = r
                if best is None or r["tau"] > row[best]["tau"]:
                    best = f"dynamic_d{d}_k{kk}"
        d = min(max(args.depths), n, 5)
        row["static"] = run(LoopConfig(k=d, max_new_tokens=args.max_new_tokens, tree=TreeConfig("static", d, 4, n)))
        row["best_dynamic"] = best
        rows.append(row)
        print(f"budget {n:>3}: chain tau {row['chain']['tau']:.2f} | best dynamic {best} tau {row[best]['tau']:.2f} | "
              f"static tau {row['static']['tau']:.2f} | lossless "
              f"{all(v['lossless'] for k, v in row.items() if isinstance(v, dict))}", flush=True)
    out = {"command": "python benchmarks/bench_tree.py " + " ".join(__import__("sys").argv[1:]),
           "checkpoint": args.checkpoint, "workloads": args.workloads, "num_prompts": len(prompts),
           "max_new_tokens": args.max_new_tokens, "prompt_format": prompt_format, "threads": torch.get_num_threads(),
           "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=1) + "\n")
    plot(rows, args.out.with_suffix(".png"))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def plot(rows: list[dict], path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3.6), dpi=100, layout="constrained")
    ax = fig.subplots()
    budgets = [r["budget"] for r in rows]
    ax.plot(budgets, [r["chain"]["tau"] for r in rows], "o-", label="chain (k = budget)")
    ax.plot(budgets, [r[r["best_dynamic"]]["tau"] for r in rows], "s-", label="dynamic tree (best D, K)")
    ax.plot(budgets, [r["static"]["tau"] for r in rows], "^-", label="static sparse tree (prior)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("verify budget (draft tokens per round)")
    ax.set_ylabel("acceptance length tau")
    ax.legend()
    fig.savefig(path)


if __name__ == "__main__":
    main()
