"""How issue 11's counting rules move the stories260K kinds-table numbers (docs/benchmarks-history.md).

Trains each kind from its debug recipe (as bench_drafter_kinds.py does), runs the greedy loop on
the same held-out prompts (mt_bench + gsm8k, 10 each, 64 new tokens, k = 5), and reports on the
SAME generations:
  tau   mean over requests (the old headline)     vs pooled sum committed / sum rounds (the new one)
  alpha every verified draft counted (old)         vs drafts after an EOS not counted (new)
Timings are not involved (the repeats/median rule changes only speed numbers).

    OMP_NUM_THREADS=1 python benchmarks/lab/bench_counting_rules.py --kinds eagle1,medusa,mlp_speculator,draft_lm
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))


def measure(target, proposer, prompts: list[torch.Tensor], k: int, max_new: int) -> dict:
    from draftsmith.eval import metrics
    from draftsmith.eval.loop import LoopConfig, generate

    taus, committed, rounds = [], 0, 0
    old_acc = old_prop = new_acc = new_prop = 0
    for ids in prompts:
        g = generate(target, proposer, ids, LoopConfig(k=k, max_new_tokens=max_new))
        c = sum(r.committed for r in g.rounds)
        if g.rounds:
            taus.append(c / len(g.rounds))
        committed, rounds = committed + c, rounds + len(g.rounds)
        for r in g.rounds:
            old_prop, old_acc = old_prop + r.proposed, old_acc + r.accepted
            p, a = metrics.counted(r)
            new_prop, new_acc = new_prop + p, new_acc + a
    return {"tau_mean": statistics.fmean(taus), "tau_pooled": committed / rounds,
            "alpha_old": old_acc / old_prop, "alpha_new": new_acc / new_prop}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default="eagle3,eagle1,medusa,mlp_speculator,draft_lm")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-counting")
    args = p.parse_args()
    from bench_drafter_kinds import train_kind

    from draftsmith.checkpoint import load_drafter
    from draftsmith.eval import proposers, workloads
    from draftsmith.targets import load as target_mod

    stories = target_mod.load(str(REPO.parent / "shared" / "models" / "stories260K-hf"))
    prompts = {w: [workloads.encode(item, stories.tokenizer)[0] for item in workloads.load(w, None, args.num_prompts)]
               for w in ("mt_bench", "gsm8k")}
    rows = []
    for kind in [k for k in args.kinds.split(",") if k] + ["ngram"]:
        target = stories
        if kind == "ngram":
            proposer = proposers.build("ngram", stories)
        else:
            ckpt = args.out / "runs" / kind / "final"
            if not (ckpt / "drafter.safetensors").exists():
                ckpt, _wall, _m = train_kind(kind, args.steps, args.out)
            loaded = load_drafter(ckpt, device="cpu")  # the target as the recipe loads it (its dtype)
            target, proposer = loaded.target, proposers.from_drafter(loaded.drafter, loaded.target)
        rows.append((kind, {w: measure(target, proposer, ps, args.k, args.max_new_tokens) for w, ps in prompts.items()}))
        print(kind, rows[-1][1], flush=True)
    print(f"\nstories260K, greedy, k={args.k}, {args.num_prompts} prompts per workload, {args.max_new_tokens} new tokens")
    print("| kind | mt_bench tau mean -> pooled | alpha old -> new | gsm8k tau mean -> pooled | alpha old -> new |")
    print("|---|---|---|---|---|")
    for kind, res in rows:
        cells = [f"{r['tau_mean']:.2f} -> {r['tau_pooled']:.2f} | {r['alpha_old']:.3f} -> {r['alpha_new']:.3f}"
                 for r in (res["mt_bench"], res["gsm8k"])]
        print(f"| {kind} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
