"""Issue 43 item 1: `prepare --features` on several ranks. Two CPU builders give the same cache as one,
tensor for tensor, each shard written by one builder; a builder SIGKILLed mid-shard loses only that
shard; a rerun with another rank count rebuilds nothing finished; fsdp2 target sharding is refused."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import yaml
from safetensors import safe_open

from draftsmith.data import TokenDataset, feature_cache
from draftsmith.testing import tiny_target
from tests.conftest import refused_in_one_line

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ranks")
    tiny = tiny_target(num_layers=2, hidden=32)
    tiny.model.save_pretrained(tmp / "target")
    tiny.tokenizer.save_pretrained(tmp / "target")
    rows = [{"messages": [{"role": "user", "content": f"question {i} " + "ab" * (i % 4)},
                          {"role": "assistant", "content": f"answer {i} " + "xy " * (1 + i % 5)}]} for i in range(12)]
    (tmp / "data.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp / "r.yaml"
    path.write_text(yaml.safe_dump({"target": {"path": str(tmp / "target"), "device": "cpu"},
                                    "data": {"path": [str(tmp / "data.jsonl")], "max_length": 64},
                                    "features": {"shard_rows": 2, "dtype": "float32"}, "drafter": {"kind": "eagle3"}}))
    return path


def _tensors(cache: Path) -> dict:
    out = {}
    for shard in sorted(cache.glob("shard_*.safetensors")):
        with safe_open(str(shard), "pt") as f:
            out.update({k: f.get_tensor(k).clone() for k in f.keys()})
    return out


def _prepare(recipe, cache, *extra):
    return subprocess.run([sys.executable, "-m", "draftsmith", "prepare", str(recipe), f"features.cache_dir={cache}",
                           "--features", *extra], env=ENV, capture_output=True, text=True, timeout=600)


def test_two_ranks_build_the_cache_one_rank_builds(recipe, tmp_path):
    one = _prepare(recipe, tmp_path / "one")
    assert one.returncode == 0, one.stderr[-3000:]
    two = _prepare(recipe, tmp_path / "two", "--nproc", "2")
    assert two.returncode == 0, two.stderr[-3000:]
    written = re.findall(r"(shard_\d+)\.safetensors rows \[\d+, \d+\) written \(rank (\d) of 2\)", two.stdout)
    names = [n for n, _ in written]
    assert sorted(names) == [f"shard_{i:05d}" for i in range(6)]  # each shard written once, by one rank
    # (which rank writes which shard depends on timing: a rank that starts first takes the other's shards too)
    a, b = _tensors(tmp_path / "one"), _tensors(tmp_path / "two")
    assert a.keys() == b.keys() and len(a) == 12 * 4
    for key in a:
        assert torch.equal(a[key], b[key]), key
    m1, m2 = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("one", "two"))
    assert m2["complete"] and [(s["start"], s["size"]) for s in m1["shards"]] == [(s["start"], s["size"]) for s in m2["shards"]]


# one builder of a shared cache, in its own process; KILL_AT: the shard start at which it SIGKILLs itself
# after writing half of the shard's temporary file
BUILDER = textwrap.dedent("""
    import os, signal, sys, torch
    from draftsmith.data import TokenDataset, feature_cache
    from draftsmith.testing import tiny_target
    root, rank, world, kill_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 250, (4 + 3 * i,), generator=g, dtype=torch.int32) for i in range(10)]
    ds = TokenDataset(ids, [torch.ones(len(x), dtype=torch.uint8) for x in ids], [f"r{i}" for i in range(10)])
    real = feature_cache._shard_tensors
    def shard_tensors(target, dataset, start, *rest):
        print("building", start, flush=True)
        if start == kill_at:
            open(os.path.join(root, "shard_%05d.safetensors.tmp" % (start // 2)), "wb").write(b"half a shard")
            os.kill(os.getpid(), signal.SIGKILL)
        return real(target, dataset, start, *rest)
    feature_cache._shard_tensors = shard_tensors
    feature_cache.build(tiny_target(num_layers=3, hidden=32, seed=0), ds, root, [0, 1, 2], "float32", shard_rows=2,
                        log=lambda *_: None, rank=rank, world=world)
""")


def _dataset():
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 250, (4 + 3 * i,), generator=g, dtype=torch.int32) for i in range(10)]
    return TokenDataset(ids, [torch.ones(len(x), dtype=torch.uint8) for x in ids], [f"r{i}" for i in range(10)])


@pytest.fixture
def one_thread():
    """Build as the subprocess builders do (OMP_NUM_THREADS=1): float sums depend on how threads split them."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_killed_rank_loses_only_its_shard_and_another_rank_count_resumes(tmp_path, monkeypatch, one_thread):
    """Rank 1 of 2 finishes its first shard (rows 2-3), then is SIGKILLed while writing its second (rows 6-7).
    The finished shard stays listed; a rerun with 3 ranks builds the rest and nothing finished twice."""
    root = tmp_path / "cache"
    killed = subprocess.run([sys.executable, "-c", BUILDER, str(root), "1", "2", "6"], env=ENV, capture_output=True,
                            text=True, timeout=600)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert re.findall(r"building (\d+)", killed.stdout) == ["2", "6"]
    manifest = json.loads((root / "manifest.json").read_text())
    assert [s["start"] for s in manifest["shards"]] == [2] and not manifest["complete"]
    assert (root / "shard_00003.safetensors.tmp").exists() and not (root / "shard_00003.safetensors").exists()
    stamp = os.stat(root / "shard_00001.safetensors").st_mtime_ns
    calls = []
    real = feature_cache._shard_tensors
    monkeypatch.setattr(feature_cache, "_shard_tensors", lambda *a: calls.append(a[2]) or real(*a))
    target = tiny_target(num_layers=3, hidden=32, seed=0)
    for rank in range(3):  # rerun with 3 ranks (one after another here)
        feature_cache.build(target, _dataset(), str(root), [0, 1, 2], "float32", shard_rows=2, log=lambda *_: None,
                            rank=rank, world=3)
    assert sorted(calls) == [0, 4, 6, 8]  # each missing shard once; the finished one never
    assert os.stat(root / "shard_00001.safetensors").st_mtime_ns == stamp
    assert not list(root.glob("*.tmp"))
    calls.clear()
    feature_cache.build(target, _dataset(), str(root), [0, 1, 2], "float32", shard_rows=2, log=lambda *_: None)
    assert calls == []  # and once more with 1 rank: nothing to do
    reference = tmp_path / "reference"
    feature_cache.build(target, _dataset(), str(reference), [0, 1, 2], "float32", shard_rows=2, log=lambda *_: None)
    a, b = _tensors(root), _tensors(reference)
    assert a.keys() == b.keys() and [k for k in a if not torch.equal(a[k], b[k])] == []
    assert len(feature_cache.open(str(root), target, [0, 1, 2])) == 10


def test_a_locked_shard_is_left_to_its_builder(tmp_path):
    """While another builder holds a shard's lock, this one skips it (never writes it) and says the cache
    is not finished."""
    from draftsmith.core.errors import UserError
    from draftsmith.data import feature_manifest as fm

    root = tmp_path / "cache"
    root.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        os.makedirs({str(root / fm.LOCKS)!r}, exist_ok=True)
        fd = os.open({str(root / fm.LOCKS / 'shard_00001.safetensors.lock')!r}, os.O_RDWR | os.O_CREAT)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.read()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match="another builder still holds a shard"):
            feature_cache.build(tiny_target(num_layers=3, hidden=32, seed=0), _dataset(), str(root), [0, 1, 2],
                                "float32", shard_rows=2, log=lambda *_: None)
        assert not (root / "shard_00001.safetensors").exists() and (root / "shard_00004.safetensors").exists()
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)


def test_fsdp2_target_sharding_is_refused_in_one_line(recipe, tmp_path, capsys):
    refused_in_one_line(capsys, ["prepare", str(recipe), f"features.cache_dir={tmp_path}/c", "--features",
                                 "train.target_sharding=fsdp2", "train.backend=ddp"],
                        "train.target_sharding: fsdp2", "replicate")


@pytest.mark.parametrize("flags,needle", [(["--nproc", "0"], "--nproc 0"), (["--nproc", "2000"], "--nproc 2000")])
def test_nproc_is_bounded(recipe, tmp_path, capsys, flags, needle):
    refused_in_one_line(capsys, ["prepare", str(recipe), f"features.cache_dir={tmp_path}/c", "--features", *flags],
                        needle)
