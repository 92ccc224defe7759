"""Acceptance of every drafter kind on stories260K after the same training budget.

Each kind trains from its debug recipe (recipes/debug/<kind>-stories260k.yaml: 300 steps,
batch 8, the same target-regenerated Alpaca answers; each recipe's own lr), then runs in the
speculative loop on the same held-out prompts (MT-bench and GSM8K, never trained on), greedy,
k = 5, with the lossless check on. Medusa and the MLP speculator get 5 heads / stages so that
k = 5 is possible. n-gram prompt lookup needs no training.

--matched adds a second row per kind sized to EAGLE-3's trainable parameters (98,816 at its
recipe; `benchmarks/kind_params.py` prints them): the options in MATCHED. The kind's own
default row stays, so each kind is seen both at its defaults and at matched size.

    OMP_NUM_THREADS=2 python benchmarks/bench_drafter_kinds.py --matched   # every kind, both sizes
    python benchmarks/bench_drafter_kinds.py --kinds eagle3 --steps 30    # smoke run

A run whose results JSON already exists in --out is not redone (delete it to redo it).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ["eagle3", "eagle1", "medusa", "mlp_speculator", "draft_lm", "dflash", "dspark", "peagle", "dflash2"]
EXTRA = {"medusa": ["drafter.num_heads=5"], "mlp_speculator": ["drafter.n_predict=5"]}
# Options that bring each kind near EAGLE-3's 98,816 trainable parameters (kind_params.py). Medusa
# cannot keep 5 heads under ~185k (each head has its own 64 x 512 lm_head), so its matched row has 3
# heads and is evaluated at k = 3 (eval refuses k > heads); the draft LM's nearest size is 1 target layer.
MATCHED = {
    "eagle1": ["drafter.intermediate_size=400"],                                 # 97,408
    "medusa": ["drafter.num_heads=3"],                                           # 110,784
    "mlp_speculator": ["drafter.n_predict=5", "drafter.tie_weights=true", "drafter.inner_dim=80"],  # 93,600
    "draft_lm": ["drafter.shrink_layers=1"],                                     # 78,272
    "dspark": ["drafter.markov_rank=8"],                                         # 111,593
    "peagle": ["drafter.train_embedding=false"],                                 # 99,008
    "dflash2": ["drafter.selector_rank=8"],                                      # 117,152
}  # eagle3 (98,816) and dflash (103,328) are matched at their defaults


def train_kind(kind: str, steps: int, out: Path, extra: list[str] | None = None,
               name: str | None = None) -> tuple[Path, float, dict]:
    from draftsmith import config
    from draftsmith.train.loop import train

    extra = EXTRA.get(kind, []) if extra is None else extra
    overrides = [f"train.max_steps={steps}", f"train.output_dir={out / 'runs' / (name or kind)}",
                 "logging.progress_bar=false", *extra]
    cfg = config.load(REPO / "recipes" / "debug" / f"{kind}-stories260k.yaml", overrides)
    start = time.perf_counter()
    result = train(cfg, overwrite=True)  # a rerun retrains each kind from scratch in its own run directory
    return result.final_checkpoint, time.perf_counter() - start, result.last_metrics


def evaluate(args_eval: list[str], out_json: Path, args, k: int | None = None) -> dict:
    cmd = ["draftsmith", "eval", *args_eval, "--workloads", args.workloads, "--k", str(k or args.k), "--num-prompts",
           str(args.num_prompts), "--max-new-tokens", str(args.max_new_tokens), "--check-lossless", "--out", str(out_json)]
    subprocess.run(cmd, check=True, cwd=REPO)
    return json.loads(out_json.read_text())


def arguments(doc: str, kinds: list[str], out: Path) -> argparse.ArgumentParser:
    """The options every kinds benchmark shares: which kinds, the training budget and the eval command's."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kinds", default=",".join(kinds))
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--workloads", default="mt_bench,gsm8k")
    p.add_argument("--num-prompts", type=int, default=10)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--out", type=Path, default=out)
    return p


def main() -> None:
    p = arguments(__doc__, KINDS, REPO / "runs" / "bench-kinds")
    p.add_argument("--matched", action="store_true", help="also train each kind at EAGLE-3's trainable-parameter count")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    runs = [(k, k, None) for k in args.kinds.split(",") if k]
    if args.matched:
        runs += [(f"{k}@matched", k, MATCHED[k]) for _, k, _ in list(runs) if k in MATCHED]
    rows = []
    for name, kind, extra in runs:
        out_json = args.out / f"{name}.json"
        wall_file = args.out / f"{name}.train_seconds"
        if not out_json.exists():
            ckpt, wall, _ = train_kind(kind, args.steps, args.out, extra, name)
            wall_file.write_text(f"{wall:.1f}\n")
            evaluate([str(ckpt)], out_json, args, k=min(args.k, 3) if name == "medusa@matched" else None)
        wall = float(wall_file.read_text()) if wall_file.exists() else float("nan")
        rows.append((name, wall, json.loads(out_json.read_text())))
    stories = str(REPO.parent / "shared" / "models" / "stories260K-hf")
    if not (args.out / "ngram.json").exists():
        evaluate(["--proposer", "ngram", "--target", stories], args.out / "ngram.json", args)
    rows.append(("ngram", 0.0, json.loads((args.out / "ngram.json").read_text())))
    print_table(rows, args)


def print_table(rows: list, args) -> None:
    """Markdown rows: pooled tau and alpha per workload, mean / median (p10-p90) per request, params."""
    workloads = list(rows[0][2]["workloads"])
    print(f"\nstories260K, greedy, k={args.k}, {args.num_prompts} prompts per workload, {args.max_new_tokens} new tokens")
    print("| run | trainable params | train s | " + " | ".join(
        f"{w} tau pooled | mean / median (p10-p90) | alpha" for w in workloads) + " | per-position acceptance (last) | lossless |")
    print("|---" * (5 + 3 * len(workloads)) + "|")
    for name, wall, res in rows:
        cells = []
        for w in workloads:
            agg = res["workloads"][w]["aggregate"]
            tau = agg["acceptance_length"]
            cells += [f"{tau.get('pooled', tau['mean']):.2f}",
                      f"{tau['mean']:.2f} / {tau['median']:.2f} ({tau['p10']:.2f}-{tau['p90']:.2f})",
                      f"{agg['acceptance_rate']:.2f}"]
        pos = agg.get("per_position_acceptance") or []
        lossless = res["lossless"]["passed"]
        params = (res.get("drafter") or {}).get("trainable_params")
        print(f"| {name} | {f'{params:,}' if params is not None else '-'} | {wall:.0f} | " + " | ".join(cells)
              + f" | {' '.join(f'{x:.2f}' if x is not None else '-' for x in pos)} | {lossless} |")
    sys.stdout.flush()

if __name__ == "__main__":
    main()
