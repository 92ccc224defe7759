"""Medusa on issue 10's stories260K protocol: acceptance length tau through draftsmith's real loop,
over several seeds, with `--set` for one ablation row.

Protocol (the one benchmarks/bench_peers.py defines; its data and measuring functions are imported,
not copied):
  target    stories260K (../shared/models/stories260K-hf), fp32
  data      240 stories sampled from the target itself (T = 0.8, 160 new tokens, our own openings,
            seed --data-seed), given to draftsmith as text rows
  drafter   Medusa, 3 heads x 1 residual block, from recipes/debug/medusa-stories260k.yaml (its lr,
            schedule and the kind's defaults) with the protocol's data and budget
  budget    --steps optimizer steps (300) x 4 sequences (~640 tokens)
  measure   bench_peers.loop_tau: draftsmith's speculative loop (eval/loop.py), greedy, k = 3,
            10 held-out prompts x 128 new tokens, EOS ignored; tau = committed / rounds, pooled;
            every output must equal target-only greedy decoding (else exit 1)

    OMP_NUM_THREADS=1 nice -n 5 python -u benchmarks/bench_medusa.py --seeds 0 1 2 --workdir /tmp/bench-medusa
    OMP_NUM_THREADS=1 nice -n 5 python -u benchmarks/bench_medusa.py --workdir /tmp/bench-medusa \\
        --set loss=kl --set train.lr=1e-2                               # one ablation row
    python benchmarks/bench_medusa.py --smoke                            # 2 steps, 1 seed (CI runs this)

`--set key=value` takes a drafter option (`loss=kl`) or any recipe key (`train.warmup_steps=0`).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_peers import DEFAULTS, STORIES, greedy_continuations, loop_tau, protocol_data, summarize  # noqa: E402

from draftsmith import config as config_mod  # noqa: E402
from draftsmith.targets import load as target_mod  # noqa: E402

RECIPE = REPO / "recipes" / "debug" / "medusa-stories260k.yaml"
HEADS, LAYERS = 3, 1  # the protocol's drafter size (issue 10)


def medusa_trainer(target, data_file: Path, out_dir: Path, steps: int, seed: int, overrides: list[str]):
    """The Medusa debug recipe as a user runs it, on the protocol's data, budget and drafter size;
    `overrides` are the ablation's changes (a bare key is a drafter option)."""
    from draftsmith.train.loop import Trainer

    protocol = [f"data.path=[{data_file}]", "data.max_length=192", "data.text_chunk_tokens=256", "data.eval_samples=0",
                "regenerate.output=null", f"target.path={STORIES}", "target.device=cpu",
                f"drafter.num_heads={HEADS}", f"drafter.num_layers={LAYERS}",
                f"train.output_dir={out_dir}", f"train.max_steps={steps}", f"train.batch_size={DEFAULTS['batch']}",
                f"train.seed={seed}", f"train.log_every={max(1, steps // 4)}", "train.eval_every=0",
                "logging.progress_bar=false", "logging.report_to=[]"]
    extra = [o if "." in o.split("=")[0] else f"drafter.{o}" for o in overrides]
    return Trainer(config_mod.load(str(RECIPE), protocol + extra), target)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--set", dest="overrides", action="append", default=[],
                    help="override, e.g. loss=kl (a drafter option) or train.lr=1e-2 (a recipe key)")
    ap.add_argument("--data-seed", type=int, default=1234)
    ap.add_argument("--prompts", type=int, default=10)
    ap.add_argument("--workdir", type=Path, default=None, help="keeps the sampled data between runs")
    ap.add_argument("--out", type=Path, default=None, help="append the result as one JSON line here")
    ap.add_argument("--smoke", action="store_true", help="2 steps, 1 seed, 8 stories x 32 tokens, 2 prompts x 24 tokens (CI)")
    args = ap.parse_args(argv)
    if not STORIES.is_dir():
        print(f"bench_medusa: {STORIES} is missing; it needs ../shared beside the repository", file=sys.stderr)
        return 2
    n_stories, prompts, eval_tokens = DEFAULTS["stories"], args.prompts, DEFAULTS["eval_new_tokens"]
    story_tokens = DEFAULTS["story_tokens"]
    if args.smoke:
        args.steps, args.seeds, n_stories, story_tokens, prompts, eval_tokens = 2, [0], 8, 32, 2, 24
    torch.set_num_threads(max(1, torch.get_num_threads()))
    target = target_mod.load(str(STORIES), dtype="float32", device="cpu")
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-medusa-"))
    work.mkdir(parents=True, exist_ok=True)
    data_file = protocol_data(target, work, n_stories, args.data_seed, story_tokens)
    evalset = greedy_continuations(target, prompts, eval_tokens)
    k = DEFAULTS["k"]
    rows = []
    for seed in args.seeds:
        t0 = time.perf_counter()
        trainer = medusa_trainer(target, data_file, work / f"medusa-{seed}", args.steps, seed, args.overrides)
        trainer.run()
        trainer.drafter.eval()
        row = {"seed": seed, "train_s": time.perf_counter() - t0,
               "trainable_params": sum(p.numel() for p in trainer.drafter.trainable_parameters())}
        # a next_token_head drafter proposes num_heads - 1 tokens: k = 3 then runs as k = 2 (the same rounds)
        row["k"] = min(k, trainer.drafter.proposing_heads)
        t0 = time.perf_counter()
        row["tau"], row["lossless"] = loop_tau(trainer.drafter, target, evalset, row["k"])
        row["eval_s"] = time.perf_counter() - t0
        rows.append(row)
        print(json.dumps({k_: (round(v, 4) if isinstance(v, float) else v) for k_, v in row.items()}), flush=True)
    s = summarize([r["tau"] for r in rows])
    report = {"protocol": {**DEFAULTS, "prompts": prompts, "eval_new_tokens": eval_tokens, "stories": n_stories,
                           "story_tokens": story_tokens, "steps": args.steps, "data_seed": args.data_seed, "heads": HEADS, "layers": LAYERS},
              "overrides": args.overrides, "runs": rows, "tau": s}
    label = " ".join(args.overrides) or "(recipe defaults)"
    print(f"medusa tau@{args.steps} {s['mean']:.3f} ± {s['std']:.3f}  (min {s['min']:.3f}, max {s['max']:.3f}, "
          f"n={len(rows)})  {label}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with args.out.open("a") as f:
            f.write(json.dumps(report) + "\n")
    if not all(r["lossless"] for r in rows):
        print("loop check FAILED: a speculative output differs from target-only greedy decoding")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
