"""`draftsmith train RECIPE [key.sub=value ...] [--print-config] [--nproc N] [--overwrite] [--api-key-env NAME]`

    draftsmith train recipes/quickstart.yaml
    draftsmith train recipes/quickstart.yaml --overwrite        # start over in an output_dir holding a run
    draftsmith train recipes/debug/eagle3-stories260k.yaml train.max_steps=50
    draftsmith train recipes/eagle3-llama3.1-8b.yaml --print-config
"""
from __future__ import annotations

import sys

from draftsmith import config
from draftsmith.core.errors import UserError


def add_arguments(p) -> None:
    p.add_argument("recipe", help="recipe YAML file")
    p.add_argument("overrides", nargs="*", help="key.sub=value overrides, e.g. train.max_steps=10")
    p.add_argument("--print-config", action="store_true", help="print the fully resolved config and exit")
    p.add_argument("--nproc", type=int, default=1, help="processes on this node (re-launches under torchrun)")
    p.add_argument("--overwrite", action="store_true",
                   help="start over in a train.output_dir that holds another run (deletes its checkpoints and logs)")
    p.add_argument("--api-key-env", default=None, metavar="NAME",
                   help="regenerate.generator=openai: the environment variable holding the server's API key "
                        "(default: DRAFTSMITH_API_KEY when set, else no key)")


def main(args) -> int:
    if args.nproc < 1:
        raise UserError(f"--nproc {args.nproc}: must be >= 1 (processes on this node; 1 trains in this process)")
    try:
        cfg = config.load(args.recipe, args.overrides)
    except config.ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.print_config:
        print(config.to_yaml(cfg), end="")
        return 0
    if args.nproc > 1:
        from draftsmith.train.launch import relaunch_under_torchrun

        return relaunch_under_torchrun(args.nproc, args.recipe, args.overrides, overwrite=args.overwrite,
                                       api_key_env=args.api_key_env)
    from draftsmith.train.loop import train

    result = train(cfg, overwrite=args.overwrite, api_key_env=args.api_key_env)
    print(f"done: {result.steps} steps, final loss {result.losses[-1]:.4f}, checkpoint {result.final_checkpoint}")
    return 0
