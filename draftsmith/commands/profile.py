"""`draftsmith profile RUN`: measure a drafter's speedup profile and write it to RUN/speedup_profile.json
(the measurement and the model are in eval/profile.py)."""
from __future__ import annotations

import argparse
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.eval.profile import run
from draftsmith.report.speedup_model import PROFILE_FILE


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", help="a training checkpoint dir (runs/NAME/final); the profile is written there")
    p.add_argument("--workloads", default="mt_bench,gsm8k", help="comma-separated workload names")
    p.add_argument("--k-max", type=int, default=6, help="deepest draft length profiled")
    p.add_argument("--num-prompts", type=int, default=8, help="per workload, for acceptance")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--batches", default="1,2,4,8,16,32", help="batch sizes of the verify-cost grid and predictions")
    p.add_argument("--contexts", default="64,256", help="context lengths of the verify-cost grid")
    p.add_argument("--repeats", type=int, default=10, help="timed forwards per grid point (minimum)")
    p.add_argument("--overhead-batch", type=int, default=8, help="batch size of the loop-overhead measurement")
    p.add_argument("--validate-batches", default="", help="e.g. 1,4,16: measure batched runs and state the error")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", type=Path, default=None, help=f"default: PATH/{PROFILE_FILE}")


def _ints(text: str, flag: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UserError(f"{flag} {text!r}: give comma-separated integers, e.g. 1,4,16") from None
    if any(v < 1 for v in out):
        raise UserError(f"{flag} {text!r}: values must be >= 1")
    return out


def main(args: argparse.Namespace) -> int:
    from draftsmith.core import bounds

    bounds.check_count(args.repeats, "--repeats", bounds.MAX_REPEATS)
    run(args.path, args.workloads.split(","), k_max=args.k_max, num_prompts=args.num_prompts,
        max_new_tokens=args.max_new_tokens, batches=_ints(args.batches, "--batches"),
        contexts=_ints(args.contexts, "--contexts"),
        repeats=args.repeats, overhead_batch=args.overhead_batch,
        validate_batches=_ints(args.validate_batches, "--validate-batches") if args.validate_batches else [],
        device=args.device, out=args.out)
    return 0
