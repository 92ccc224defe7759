"""The stdlib code corpus: disjoint, deterministic, non-empty splits and deterministic prompts."""
from __future__ import annotations

import sysconfig
from pathlib import Path

import pytest

from draftsmith.data import stdlib_corpus


def _rel(paths: list[Path]) -> list[str]:
    root = stdlib_corpus.stdlib_dir()
    return [p.relative_to(root).as_posix() for p in paths]


def test_splits_are_disjoint_nonempty_and_cover_the_corpus():
    by_split = {s: _rel(stdlib_corpus.files(s)) for s in stdlib_corpus.SPLITS}
    for name, rels in by_split.items():
        assert rels, f"split {name} is empty"
        assert rels == sorted(rels), f"split {name} is not sorted by relative path"
    sets = [set(v) for v in by_split.values()]
    assert sum(len(s) for s in sets) == len(set.union(*sets)), "a file is in two splits"
    total = sum(len(s) for s in sets)
    assert len(by_split["target"]) > 0.7 * total
    assert 0.04 * total < len(by_split["heldout"]) < 0.2 * total
    assert "os.py" in set.union(*sets)


def test_exclusions_hold():
    for split in stdlib_corpus.SPLITS:
        for rel, path in zip(_rel(stdlib_corpus.files(split)), stdlib_corpus.files(split)):
            parts = rel.split("/")[:-1]
            assert not {"test", "tests", "idlelib", "lib2to3", "site-packages"} & set(parts), rel
            assert path.stat().st_size <= 200 * 1024, rel


def test_split_is_a_stable_hash_of_the_path():
    # Fixed by sha1 of the path, not by the machine or the listing order: pinned values (sha1 % 100
    # gives buckets 67, 5, 94, 81, 97; target is [0, 80), drafter [80, 90), heldout [90, 100)).
    pinned = {"os.py": "target", "asyncio/tasks.py": "target", "collections/__init__.py": "heldout",
              "pkg/mod0.py": "drafter", "pkg/mod3.py": "heldout"}
    assert {rel: stdlib_corpus.split_of(rel) for rel in pinned} == pinned
    assert {stdlib_corpus.split_of(f"pkg/mod{i}.py") for i in range(200)} == set(stdlib_corpus.SPLITS)
    for rel in _rel(stdlib_corpus.files("heldout")):
        assert stdlib_corpus.split_of(rel) == "heldout"


def test_documents_are_deterministic_and_match_files():
    first = list(stdlib_corpus.documents("drafter", max_files=5))
    again = list(stdlib_corpus.documents("drafter", max_files=5))
    assert first == again and len(first) == 5
    assert [d for d, _ in first] == _rel(stdlib_corpus.files("drafter"))[:5]
    assert all(text.strip() for _, text in first)


def test_prompts_are_deterministic_line_cut_prefixes():
    a = stdlib_corpus.prompts("heldout", n=8, prompt_chars=300, seed=0)
    b = stdlib_corpus.prompts("heldout", n=8, prompt_chars=300, seed=0)
    c = stdlib_corpus.prompts("heldout", n=8, prompt_chars=300, seed=1)
    assert a == b and a != c
    docs = dict(stdlib_corpus.documents("heldout"))
    assert len({p["id"] for p in a}) == 8
    for p in a:
        assert set(p) == {"id", "prompt"}
        assert 0 < len(p["prompt"]) <= 300 and p["prompt"].endswith("\n")
        assert docs[p["id"]].startswith(p["prompt"])


def test_too_many_prompts_and_bad_split_raise():
    with pytest.raises(ValueError, match="heldout"):
        stdlib_corpus.prompts("heldout", n=10_000)
    with pytest.raises(ValueError, match="unknown stdlib corpus split"):
        stdlib_corpus.files("train")


def test_missing_sources_name_the_directory(monkeypatch, tmp_path):
    monkeypatch.setattr(sysconfig, "get_paths", lambda: {"stdlib": str(tmp_path)})
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        stdlib_corpus.files("target")
