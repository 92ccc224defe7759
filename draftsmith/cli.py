"""The `draftsmith` command: one subcommand per stage of a drafter's life.

    draftsmith train recipes/quickstart.yaml [key.sub=value ...] [--print-config] [--nproc N]
    draftsmith validate recipes/...            # validate one or more recipes (directories are globbed)
    draftsmith prepare recipe.yaml             # regenerate answers with the target / build the feature cache
    draftsmith eval runs/NAME/final --workloads spec_bench,mt_bench --k 5
    draftsmith profile runs/NAME/final         # speedup_profile.json: acceptance, costs, best k per batch
    draftsmith plan runs/NAME --goal-tau 2.5   # learning curve: tau per k now, tokens and hours to a goal
    draftsmith export runs/NAME/final --to vllm|sglang|trtllm|hf|llama.cpp --out DIR
    draftsmith leaderboard results/*.json --out leaderboard/
    draftsmith report results/run.json
    draftsmith ls                              # drafter kinds, workloads, export formats, recipes
    draftsmith inspect TARGET [--kind K]       # a target's shape, rope, features, kinds that work
    draftsmith doctor EXPORT_DIR -- vllm serve ...   # check a serve command against the export (exit 1: mismatch)

Expected errors (a bad path, value or key, a mismatch, a missing file, an offline load without
a cache) print one line naming the file, key or value and the fix, and exit 2. Add `--debug`
anywhere on the command line (or set DRAFTSMITH_DEBUG=1) to see the traceback instead.

Each subcommand lives in the module that owns its stage; that module provides
`add_arguments(parser)` and `main(args) -> int`.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from draftsmith.core.errors import EXPECTED, one_line

SUBCOMMANDS = {
    "train": ("draftsmith.commands.train", "train a drafter from a recipe"),
    "validate": ("draftsmith.commands.validate", "validate recipes without running them"),
    "prepare": ("draftsmith.commands.prepare", "regenerate answers with the target; build the offline feature cache"),
    "eval": ("draftsmith.commands.eval", "run a drafter in the speculative loop and measure it"),
    "profile": ("draftsmith.commands.profile", "measure a drafter's speedup profile (speedup_profile.json beside it)"),
    "plan": ("draftsmith.commands.plan", "fit a run's learning curve; the tokens and hours a tau goal needs"),
    "export": ("draftsmith.commands.export", "export a drafter for vLLM, SGLang, TensorRT-LLM or HF"),
    "leaderboard": ("draftsmith.commands.leaderboard", "build an acceptance leaderboard from result files"),
    "report": ("draftsmith.commands.report", "show one result file in the terminal and as HTML"),
    "ls": ("draftsmith.commands.ls", "list drafter kinds, workloads, export formats and recipes"),
    "inspect": ("draftsmith.commands.inspect", "show a target's shape, rope, features and the drafter kinds that work for it"),
    "doctor": ("draftsmith.commands.doctor", "check a serve command or engine config against what an export was trained for"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftsmith", description=__doc__.split("\n\n")[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks of expected errors (also after COMMAND)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module_name, help_text) in SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_text)
        if only is None or name == only:
            module = importlib.import_module(module_name)
            module.add_arguments(p)
            p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv or os.environ.get("DRAFTSMITH_DEBUG", "") not in ("", "0")
    argv = [a for a in argv if a != "--debug"]
    only = argv[0] if argv and argv[0] in SUBCOMMANDS else None
    parser = build_parser(only)
    args, extra = parser.parse_known_args(argv)
    if extra:  # key=value overrides may also follow the flags: `train R --print-config k=v`
        if not hasattr(args, "overrides") or any(e.startswith("-") or "=" not in e for e in extra):
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        args.overrides = list(args.overrides) + extra
    if not getattr(args, "_module", None):
        parser.print_help()
        return 0 if not argv else 2
    module = args._module
    try:
        return int(module.main(args) or 0)
    except EXPECTED as exc:
        if debug:
            raise
        print(f"draftsmith {args.command}: error: {one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
