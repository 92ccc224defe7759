"""`draftsmith validate PATH [PATH ...]`: validate recipes (directories are searched recursively)
and report every problem of every file; exit 1 if any recipe is invalid."""
from __future__ import annotations

import sys
from pathlib import Path

from draftsmith import config


def add_arguments(p) -> None:
    p.add_argument("paths", nargs="+", help="recipe files or directories")


def recipe_files(paths: list[str]) -> list[Path]:
    files: list[Path] = []
    for path in map(Path, paths):
        files.extend(sorted(path.rglob("*.yaml")) + sorted(path.rglob("*.yml")) if path.is_dir() else [path])
    return files


def main(args) -> int:
    files = recipe_files(args.paths)
    if not files:
        print(f"no recipes found under {' '.join(args.paths)}", file=sys.stderr)
        return 1
    bad = 0
    for file in files:
        try:
            config.load(file)
            print(f"ok       {file}")
        except config.ConfigError as exc:
            bad += 1
            print(f"INVALID  {exc}")
    print(f"{len(files) - bad} valid, {bad} invalid")
    return 1 if bad else 0
