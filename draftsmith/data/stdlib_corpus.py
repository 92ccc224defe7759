"""A deterministic code corpus from the running Python's standard-library sources.

Every CPython install carries its stdlib as `.py` text, so this corpus needs no download.
It trains the embedded target `builtin:pycode-tiny` (scripts/build_pycode_target.py) and
gives drafter data and held-out eval prompts that the target never saw.

Files: `*.py` under `sysconfig.get_paths()["stdlib"]`, sorted by relative POSIX path,
excluding site-packages/dist-packages, every `test/` and `tests/` directory, idlelib, lib2to3
and files over 200 KB. Each file's split is fixed by a stable hash of its relative path:
sha1(path) as an integer % 100 -> [0, 80) "target", [80, 90) "drafter", [90, 100) "heldout".

    from draftsmith.data import stdlib_corpus
    for doc_id, text in stdlib_corpus.documents("drafter", max_files=10): ...
    prompts = stdlib_corpus.prompts("heldout", n=20)   # [{"id": ..., "prompt": ...}]
"""
from __future__ import annotations

import hashlib
import random
import sysconfig
import tokenize
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from draftsmith.core.errors import UserError

SPLITS = {"target": (0, 80), "drafter": (80, 90), "heldout": (90, 100)}
EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "test", "tests", "idlelib", "lib2to3", "__pycache__"})
MAX_FILE_BYTES = 200 * 1024


def stdlib_dir() -> Path:
    """The running interpreter's stdlib source directory; raises if it holds no .py sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not (root / "os.py").is_file():
        raise FileNotFoundError(
            f"no Python standard-library sources in {root} (os.py is missing): this Python ships "
            "bytecode only. Use a Python that installs its stdlib .py files (python.org, pyenv, "
            "conda, or the distribution's python3-dev/libpython3-stdlib package)."
        )
    return root


def split_of(rel_path: str) -> str:
    """The split of one file, from sha1 of its relative POSIX path (stable across machines)."""
    bucket = int(hashlib.sha1(rel_path.encode("utf-8")).hexdigest(), 16) % 100
    for name, (lo, hi) in SPLITS.items():
        if lo <= bucket < hi:
            return name
    raise AssertionError(f"bucket {bucket} is outside SPLITS {SPLITS}")


@lru_cache(maxsize=4)
def _all_files(root: Path) -> tuple[tuple[str, Path], ...]:
    """(relative POSIX path, absolute path) of every corpus file under root, sorted by path."""
    out = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.intersection(rel.parts[:-1]) or not path.is_file():
            continue
        if path.stat().st_size > MAX_FILE_BYTES:
            continue
        out.append((rel.as_posix(), path))
    out.sort(key=lambda item: item[0])
    return tuple(out)


def _check_split(split: str) -> None:
    if split not in SPLITS:
        raise UserError(f"unknown stdlib corpus split {split!r}; choose one of {list(SPLITS)}")


def files(split: str) -> list[Path]:
    """Absolute paths of the split's files, sorted by relative path."""
    _check_split(split)
    return [path for rel, path in _all_files(stdlib_dir()) if split_of(rel) == split]


def read_source(path: Path) -> str:
    """A source file's text, decoded by its PEP 263 coding cookie (utf-8 by default)."""
    with tokenize.open(path) as f:
        return f.read()


def documents(split: str, max_files: int | None = None) -> Iterator[tuple[str, str]]:
    """Yield (doc_id = relative POSIX path, text) for the split's files in sorted order."""
    _check_split(split)
    root = stdlib_dir()
    count = 0
    for rel, path in _all_files(root):
        if max_files is not None and count >= max_files:
            return
        if split_of(rel) != split:
            continue
        count += 1
        yield rel, read_source(path)


def prompts(split: str = "heldout", n: int = 20, prompt_chars: int = 400, seed: int = 0) -> list[dict]:
    """n code prefixes of distinct files, each cut at a line boundary to at most prompt_chars.

    Only files with at least prompt_chars + 200 more characters are eligible, so every
    prompt has a real continuation. The choice is random.Random(seed) over the sorted
    eligible files: the same arguments give the same prompts on every machine with the
    same Python version.
    """
    eligible: list[tuple[str, str]] = []
    for doc_id, text in documents(split):
        head = text[:prompt_chars]
        cut = head.rfind("\n")
        if len(text) >= prompt_chars + 200 and cut > 0:
            eligible.append((doc_id, head[: cut + 1]))
    if n > len(eligible):
        raise UserError(
            f"asked for {n} prompts but split {split!r} has only {len(eligible)} files longer than "
            f"{prompt_chars + 200} characters under {stdlib_dir()}; lower n or prompt_chars"
        )
    chosen = random.Random(seed).sample(range(len(eligible)), n)
    return [{"id": eligible[i][0], "prompt": eligible[i][1]} for i in chosen]
