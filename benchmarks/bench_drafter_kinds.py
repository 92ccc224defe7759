"""Acceptance of every drafter kind on stories260K after the same training budget.

Each kind trains from its debug recipe (recipes/debug/<kind>-stories260k.yaml: 300 steps,
batch 8, lr 2e-3, the same target-regenerated Alpaca answers), then runs in the speculative
loop on the same held-out prompts (MT-bench and GSM8K, never trained on), greedy, k = 5, with
the lossless check on. Medusa and the MLP speculator get 5 heads / stages so that k = 5 is
possible. n-gram prompt lookup needs no training.

    OMP_NUM_THREADS=2 python benchmarks/bench_drafter_kinds.py            # ~25 min on 2 cores
    python benchmarks/bench_drafter_kinds.py --kinds eagle3 --steps 30    # smoke run
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ["eagle3", "eagle1", "medusa", "mlp_speculator", "draft_lm"]
EXTRA = {"medusa": ["drafter.num_heads=5"], "mlp_speculator": ["drafter.n_predict=5"]}


def train_kind(kind: str, steps: int, out: Path) -> tuple[Path, float, dict]:
    from draftsmith import config
    from draftsmith.train.loop import train

    overrides = [f"train.max_steps={steps}", f"train.output_dir={out / 'runs' / kind}", "logging.progress_bar=false",
                 *EXTRA.get(kind, [])]
    cfg = config.load(REPO / "recipes" / "debug" / f"{kind}-stories260k.yaml", overrides)
    start = time.perf_counter()
    result = train(cfg, overwrite=True)  # a rerun retrains each kind from scratch in its own run directory
    return result.final_checkpoint, time.perf_counter() - start, result.last_metrics


def evaluate(args_eval: list[str], out_json: Path, args) -> dict:
    cmd = ["draftsmith", "eval", *args_eval, "--workloads", args.workloads, "--k", str(args.k), "--num-prompts",
           str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens), "--check-lossless", "--out", str(out_json)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads(out_json.read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(KINDS))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--workloads", default="mt_bench,gsm8k")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=REPO / "runs" / "bench-kinds")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for kind in [k for k in args.kinds.split(",") if k]:
        ckpt, wall, metrics = train_kind(kind, args.steps, args.out)
        res = evaluate([str(ckpt)], args.out / f"{kind}.json", args)
        rows.append((kind, wall, metrics, res))
    stories = str(REPO.parent / "shared" / "models" / "stories260K-hf")
    res = evaluate(["--proposer", "ngram", "--target", stories], args.out / "ngram.json", args)
    rows.append(("ngram", 0.0, {}, res))
    workloads = list(rows[0][3]["workloads"])
    print(f"\nstories260K, greedy, k={args.k}, {args.num_prompts} prompts per workload, {args.max_new_tokens} new tokens")
    print(f"{'kind':<16}{'train s':>8}  " + "  ".join(f"{w + ' tau':>18}{'alpha':>7}" for w in workloads))
    for kind, wall, _, res in rows:
        cells = []
        for w in workloads:
            agg = res["workloads"][w]["aggregate"]
            tau = agg["acceptance_length"]
            cells.append(f"{tau['median']:>8.2f} ({tau['p10']:.2f}-{tau['p90']:.2f}){agg['acceptance_rate']:>7.2f}")
        print(f"{kind:<16}{wall:>8.0f}  " + "  ".join(cells))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
