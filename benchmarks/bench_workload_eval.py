"""The drafter on the loop's own contexts, against the loop: for a checkpoint, train.workload_eval's teacher-forced
acc_i on the target's greedy answers to each workload's first N prompts (what training logs as
eval_<workload>/acc_i), beside the per-position acceptance and tau that `draftsmith eval` measured on the same
prompts (its result JSON, whose workloads, prompt count, answer length and prompt format are then used).

    python benchmarks/bench_workload_eval.py recipes/cpu/eagle3-smollm2-135m.yaml runs/sweep/L-all-60/final \
        --eval-result runs/smollm2-eval41/loop-all60-k3.json

Prints one row per workload (and the held-out rows' for comparison). Numbers: docs/training.md "The loop's own
contexts".
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from draftsmith import config  # noqa: E402
from draftsmith.core.errors import UserError  # noqa: E402
from draftsmith.report.learning_curve import metric_name  # noqa: E402
from draftsmith.report.speedup_model import expected_tau  # noqa: E402


def loop_numbers(path: Path) -> tuple[dict, dict]:
    """A `draftsmith eval` result -> (its settings, {workload: (per-position acceptance, pooled tau)})."""
    try:
        result = json.loads(path.read_text())
        settings = result["config"]
        measured = {name: (w["aggregate"]["per_position_acceptance"], w["aggregate"]["acceptance_length"]["pooled"])
                    for name, w in result["workloads"].items()}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{path}: not a `draftsmith eval` result with per-workload acceptance ({exc!r:.80})") from None
    return settings, measured


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", type=Path, help="the recipe the checkpoint was trained with (its target and data)")
    ap.add_argument("checkpoint", type=Path, help="a checkpoint directory (RUN/final)")
    ap.add_argument("--eval-result", type=Path, default=None, help="`draftsmith eval --out` JSON on the same drafter")
    ap.add_argument("--workloads", default=None, help="comma-separated (default: the eval result's)")
    ap.add_argument("--num-prompts", type=int, default=None)
    ap.add_argument("--max-new-tokens", type=int, default=None)
    ap.add_argument("--k", type=int, default=3)
    args = ap.parse_args()
    settings, measured = loop_numbers(args.eval_result) if args.eval_result else ({}, {})
    names = args.workloads.split(",") if args.workloads else list(measured)
    if not names:
        raise UserError("give --workloads or --eval-result")
    from draftsmith.eval import workloads

    names = workloads.expand(names)  # spec_bench -> its six tasks, as train.workload_eval logs them
    num_prompts = args.num_prompts or settings.get("num_prompts") or (None if args.eval_result else 10)
    if num_prompts is None:
        raise UserError(f"{args.eval_result} ran every prompt of its workloads; give --num-prompts N to match it")
    max_new = args.max_new_tokens or settings.get("max_new_tokens") or 128
    prompt_format = settings.get("prompt_format") or "auto"
    from draftsmith.train.loop import Trainer

    with tempfile.TemporaryDirectory() as out:
        cfg = config.load(args.recipe, [f"train.init_from={args.checkpoint}", f"train.output_dir={out}",
                                        "train.max_steps=1", "train.eval_every=1", "logging.report_to=[console]",
                                        "logging.progress_bar=false", f"train.workload_eval.workloads=[{','.join(names)}]",
                                        f"train.workload_eval.num_prompts={num_prompts}",
                                        f"train.workload_eval.max_new_tokens={max_new}",
                                        f"train.workload_eval.prompt_format={prompt_format}"])
        trainer = Trainer(cfg)
        try:
            start = time.perf_counter()
            results = trainer.evaluate()  # no training step: the checkpoint's weights as loaded
            seconds = time.perf_counter() - start
        finally:
            trainer.release()
    print(f"\n{args.checkpoint}: teacher-forced on the target's greedy answers ({num_prompts} prompts, {max_new} "
          f"new tokens) against the loop ({args.eval_result or 'not given'}), k = {args.k}; one evaluation "
          f"{seconds:.1f} s, {trainer.workload_eval_s:.1f} s of it on the workloads\n")
    print("| rows | teacher-forced acc_i | tau | loop acceptance per position | loop tau (pooled) |")
    print("|---|---|---|---|---|")
    rows = [(w, [results[metric_name(w, f"acc_{i}")] for i in range(args.k) if metric_name(w, f"acc_{i}") in results])
            for w in names]
    if "eval_acc_0" in results:
        rows.append(("held-out rows", [results[f"eval_acc_{i}"] for i in range(args.k) if f"eval_acc_{i}" in results]))
    for name, accs in rows:
        loop = measured.get(name)
        loop_cells = (" / ".join(f"{a:.3f}" for a in loop[0][:args.k]), f"{loop[1]:.3f}") if loop else ("-", "-")
        print(f"| {name} | {' / '.join(f'{a:.3f}' for a in accs)} | {expected_tau(accs, args.k)[0]:.3f} | "
              f"{loop_cells[0]} | {loop_cells[1]} |")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
