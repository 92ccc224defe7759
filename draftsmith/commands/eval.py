"""`draftsmith eval`: run a drafter in the speculative loop on workloads and measure it.

    draftsmith eval runs/eagle3-stories260k/final --workloads spec_bench,mt_bench --k 5
    draftsmith eval runs/eagle3-stories260k/final --temperature 1.0 --check-lossless
    draftsmith eval --draft-model DIR_OR_ID --target ../shared/models/stories260K-hf --workloads mt_bench
    draftsmith eval --proposer ngram --target builtin:pycode-tiny --workloads pycode --k 4
    draftsmith eval runs/eagle3-stories260k/final --engine llama.cpp --workloads mt_bench --k 3   (eval_engine.py)

The flags are EvalOptions' fields (draftsmith/eval/options.py); the run is the library's
draftsmith.eval.evaluate.run(EvalOptions). `--engine llama.cpp` runs commands/eval_engine.py instead (it stands
above eval/ and export/). Exit status 1 when --check-lossless finds a prompt whose greedy speculative output
differs from target-only greedy output.
"""
from __future__ import annotations

import argparse

from draftsmith.eval.evaluate import run
from draftsmith.eval.options import EvalOptions, add_arguments  # noqa: F401  (the command's flags)


def main(args: argparse.Namespace) -> int:
    if getattr(args, "engine", None):
        from draftsmith.commands import eval_engine

        return eval_engine.main(args)
    return 0 if run(EvalOptions.from_args(args)).passed else 1
