"""Trainable parameters of every drafter kind as its stories260K debug recipe builds it (no training,
no data): the size column of the kinds table, and a way to pick options that match sizes.

    python benchmarks/kind_params.py
    python benchmarks/kind_params.py --set medusa:num_heads=3 --set mlp_speculator:n_predict=3
"""
from __future__ import annotations

import argparse
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
KINDS = ["eagle3", "eagle1", "medusa", "mlp_speculator", "draft_lm", "dflash", "dspark", "peagle", "dflash2"]


def trainable_params(kind: str, overrides: list[str]) -> int:
    from draftsmith import config
    from draftsmith.heads import DRAFTERS
    from draftsmith.targets import load as target_mod

    cfg = config.load(REPO / "recipes" / "debug" / f"{kind}-stories260k.yaml", overrides)
    target = target_mod.from_config(cfg.target)
    drafter = DRAFTERS.get(kind).from_target(cfg.drafter.options, target, None)
    return sum(p.numel() for p in drafter.trainable_parameters())


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="KIND:key=value (drafter option)")
    args = ap.parse_args(argv)
    print("| kind | options | trainable params |\n|---|---|---|")
    for kind in [k for k in args.kinds.split(",") if k]:
        extra = [f"drafter.{o.split(':', 1)[1]}" for o in args.overrides if o.split(":", 1)[0] == kind]
        print(f"| {kind} | {' '.join(extra) or '(recipe)'} | {trainable_params(kind, extra):,} |")


if __name__ == "__main__":
    main()
