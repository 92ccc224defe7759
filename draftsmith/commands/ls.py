"""`draftsmith ls`: what this install offers — drafter kinds, workloads, export formats, recipes."""
from __future__ import annotations

import importlib
from pathlib import Path

# (title, module holding the registry, registry attribute)
REGISTRIES = [
    ("drafter kinds", "draftsmith.heads", "DRAFTERS"),
    ("workloads", "draftsmith.eval.workloads", "WORKLOADS"),
    ("proposers", "draftsmith.eval.proposers", "PROPOSERS"),
    ("export formats", "draftsmith.export", "EXPORTERS"),
]


def add_arguments(p) -> None:
    p.add_argument("--recipes", default="recipes", help="directory searched for recipes (default: recipes)")


def format_kinds() -> list[str]:
    """One line per export format: the drafter kinds it takes (export.formats_for, a loop over can_export)."""
    from draftsmith.export import EXPORTERS, formats_for
    from draftsmith.heads import DRAFTERS

    takes = {fmt: [k for k in DRAFTERS.names() if fmt in formats_for(k)] for fmt in EXPORTERS.names()}
    return [f"  {fmt}: {', '.join(kinds) or 'no drafter kind yet'}" for fmt, kinds in takes.items()]


def main(args) -> int:
    for title, module_name, attr in REGISTRIES:
        try:
            registry = getattr(importlib.import_module(module_name), attr)
        except (ImportError, AttributeError) as exc:
            print(f"{title}: unavailable ({exc})")
            continue
        print(f"{title}: {', '.join(registry.names())}")
        if attr == "EXPORTERS":
            print("\n".join(format_kinds()))
    recipes = sorted(Path(args.recipes).rglob("*.yaml")) if Path(args.recipes).is_dir() else []
    print(f"recipes ({args.recipes}/): " + (", ".join(str(r) for r in recipes) if recipes else "none found"))
    return 0
