"""Issue 44 item 2: the feature cache is a received file. manifest.json is read bounded and typed, shards
stay inside the cache, and a damaged shard is rebuilt by `prepare --features` (size and sha256 recorded)
or refused by training, each in one line naming the file."""
from __future__ import annotations

import json
import os
import shutil
import time

import pytest
import torch
from safetensors import safe_open

from draftsmith.core.errors import UserError
from draftsmith.data import TokenDataset, feature_cache
from draftsmith.testing import tiny_target

LAYERS = [0, 1, 2]
QUIET = dict(log=lambda *_: None)


@pytest.fixture(scope="module")
def target():
    return tiny_target(num_layers=3, hidden=32, seed=0)


def _dataset(n=5):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 250, (4 + 3 * i,), generator=g, dtype=torch.int32) for i in range(n)]
    return TokenDataset(ids, [torch.ones(len(x), dtype=torch.uint8) for x in ids], [f"r{i}" for i in range(n)])


@pytest.fixture(scope="module")
def built(tmp_path_factory, target):
    root = tmp_path_factory.mktemp("cache")
    feature_cache.build(target, _dataset(), str(root), LAYERS, "float32", shard_rows=2, **QUIET)
    return root


@pytest.fixture
def cache(built, tmp_path):
    root = tmp_path / "cache"
    shutil.copytree(built, root)
    return root


def _one_line(exc_info, *needles):
    text = str(exc_info.value)
    assert "\n" not in text and len(text) < 2000, text
    for needle in needles:
        assert needle in text, text
    return text


def _edit(root, change):
    path = root / "manifest.json"
    m = json.loads(path.read_text())
    change(m)
    path.write_text(json.dumps(m))


def _both_refuse(root, target, *needles):
    """open (train) and build (prepare) both refuse in one line, quickly."""
    t0 = time.monotonic()
    with pytest.raises(UserError) as exc:
        feature_cache.open(str(root), target, LAYERS)
    _one_line(exc, *needles)
    with pytest.raises(UserError) as exc:
        feature_cache.build(target, _dataset(), str(root), LAYERS, "float32", shard_rows=2, **QUIET)
    _one_line(exc, *needles)
    assert time.monotonic() - t0 < 30


def test_manifest_special_files_are_refused(cache, target):
    (cache / "manifest.json").unlink()
    os.symlink("/dev/zero", cache / "manifest.json")
    _both_refuse(cache, target, "manifest.json", "character device")
    (cache / "manifest.json").unlink()
    os.mkfifo(cache / "manifest.json")
    _both_refuse(cache, target, "manifest.json", "FIFO")


@pytest.mark.parametrize("text,needle", [("[" * 100_000 + "]" * 100_000, "nested too deeply"),
                                         ("[]", "JSON list"), ("{\"a\":", "not valid JSON")])
def test_manifest_that_is_not_an_object_is_refused(cache, target, text, needle):
    (cache / "manifest.json").write_text(text)
    _both_refuse(cache, target, "manifest.json", needle)


@pytest.mark.parametrize("change,needle", [
    (lambda m: m.pop("shards"), "shards is NoneType"),
    (lambda m: m.update(shards={"a": 1}), "shards is dict"),
    (lambda m: m.update(dtype="int4"), "dtype 'int4'"),
    (lambda m: m.update(dtype=["float32"]), "dtype"),
    (lambda m: m.update(rows=10**12), "rows"),
    (lambda m: m.update(rows=7), "shards[2] covers rows [4, 5), not a shard of 2 rows"),
    (lambda m: m.update(rows=6), "shards[2] covers rows [4, 5)"),
    (lambda m: m["shards"].pop(), "complete is true but its shards cover 4 of its 5 rows"),
    (lambda m: m.update(complete="yes"), "complete"),
    (lambda m: m.update(tokens=1), "tokens is '1' but its shards hold"),
    (lambda m: m.update(layers="0,1,2"), "layers"),
    (lambda m: m.update(features=["target_logits"]), "features"),
    (lambda m: m["shards"][0].update(start=-5, end=10**9), "shards[0].start"),
    (lambda m: m["shards"][0].update(end=10**9), "shards[0].end"),
    (lambda m: m["shards"].append(dict(m["shards"][0])), "a second time"),
    (lambda m: m["shards"][0].update(file="../../x.safetensors"), "shards[0].file is '../../x.safetensors'"),
    (lambda m: m["shards"][0].update(file="/etc/passwd"), "shards[0].file is '/etc/passwd'"),
    (lambda m: m["shards"][0].update(file=m["shards"][1]["file"]), "shards[0].file"),
    (lambda m: m["shards"][0].pop("sha256"), "shards[0].sha256"),
    (lambda m: m["shards"][0].update(size=True), "shards[0].size"),
])
def test_manifest_values_are_typed(cache, target, change, needle):
    _edit(cache, change)
    _both_refuse(cache, target, "manifest.json", needle)


def test_a_manifest_from_the_old_format_asks_for_a_rebuild(cache, target):
    _edit(cache, lambda m: m.update(format_version=1))
    _both_refuse(cache, target, "format_version", "draftsmith prepare recipe.yaml --features")


def _shard_bytes(root, name="shard_00001.safetensors"):
    return (root / name).read_bytes()


@pytest.mark.parametrize("damage", ["truncated", "empty", "another shard's bytes", "flipped byte"])
def test_prepare_rebuilds_a_damaged_shard(cache, target, damage):
    good = _shard_bytes(cache)
    shard = cache / "shard_00001.safetensors"
    with safe_open(str(shard), "pt") as old:
        good_tensors = {key: old.get_tensor(key).clone() for key in old.keys()}
    if damage == "truncated":
        shard.write_bytes(good[:len(good) // 2])
    elif damage == "empty":
        shard.write_bytes(b"")
    elif damage == "another shard's bytes":
        shard.write_bytes(_shard_bytes(cache, "shard_00000.safetensors"))
    else:
        shard.write_bytes(good[:-3] + bytes([good[-3] ^ 1]) + good[-2:])
    if damage in ("truncated", "empty", "another shard's bytes"):  # training refuses it before reading garbage
        with pytest.raises(UserError) as exc:
            rows = feature_cache.open(str(cache), target, LAYERS)
            rows.lengths()
        _one_line(exc, "shard_00001.safetensors")
    logs = []
    stamp = os.stat(cache / "shard_00000.safetensors").st_mtime_ns
    feature_cache.build(target, _dataset(), str(cache), LAYERS, "float32", shard_rows=2, log=logs.append)
    assert any("shard_00001.safetensors is damaged" in line and "rebuilding" in line for line in logs), logs
    assert not any("shard_00000" in line for line in logs)
    assert os.stat(cache / "shard_00000.safetensors").st_mtime_ns == stamp
    with safe_open(str(shard), "pt") as new:
        assert set(new.keys()) == {f"{r}/{n}" for r in (2, 3) for n in ("input_ids", "loss_mask", "aux_hidden_states",
                                                                           "last_hidden_state")}
    with safe_open(str(shard), "pt") as new:  # rebuilt with the same tensors (safetensors orders metadata freely)
        for key in new.keys():
            assert torch.equal(new.get_tensor(key), good_tensors[key]), key
    assert len(feature_cache.open(str(cache), target, LAYERS)) == 5


@pytest.mark.parametrize("kind", ["fifo", "link"])
def test_a_shard_that_is_not_a_regular_file_is_refused(cache, target, kind):
    shard = cache / "shard_00001.safetensors"
    shard.unlink()
    if kind == "fifo":
        os.mkfifo(shard)
    else:
        os.symlink(cache / "shard_00000.safetensors", shard)
    _both_refuse(cache, target, "shard_00001.safetensors", "FIFO" if kind == "fifo" else "symbolic link",
                 "not a regular file inside the cache")


def test_a_shard_of_another_size_is_refused_by_training_at_open(cache, target):
    with open(cache / "shard_00002.safetensors", "ab") as f:
        f.write(b"\0" * 10)
    with pytest.raises(UserError) as exc:
        feature_cache.open(str(cache), target, LAYERS)
    _one_line(exc, "shard_00002.safetensors", "the manifest recorded")
