"""Offline feature cache: the stored hidden states equal an online forward, the cache refuses
another target or layer set, and an interrupted build resumes without rewriting finished shards."""
from __future__ import annotations

import json
import os

import pytest
import torch

from draftsmith.data import TokenDataset, collate, feature_cache, features
from draftsmith.testing import tiny_target

LAYERS = [0, 1, 2]
REQUIRED = {"input_ids", "loss_mask", "aux_hidden_states", "target_logits"}


@pytest.fixture(scope="module")
def target():
    return tiny_target(num_layers=3, hidden=32, seed=0)


def _dataset(n=5):
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(3, 250, (4 + 3 * i,), generator=g, dtype=torch.int32) for i in range(n)]
    masks = [torch.tensor([0] + [1] * (len(x) - 1), dtype=torch.uint8) for x in ids]
    return TokenDataset(ids, masks, [f"r{i}" for i in range(n)])


def test_cache_matches_online_features(tmp_path, target):
    ds = _dataset()
    manifest = feature_cache.build(target, ds, str(tmp_path), LAYERS, "float32", shard_rows=2, required=REQUIRED,
                                   batch_size=3, log=lambda *_: None)
    assert manifest["complete"] and manifest["rows"] == 5 and len(manifest["shards"]) == 3
    assert manifest["features"] == ["aux_hidden_states", "last_hidden_state"]
    assert manifest["tokens"] == ds.num_tokens and manifest["loss_tokens"] == ds.num_loss_tokens
    cached = feature_cache.open(str(tmp_path), target, LAYERS, REQUIRED)
    assert len(cached) == 5
    for i in (0, 4):
        item, ref = cached[i], ds[i]
        assert torch.equal(item["input_ids"], ref["input_ids"]) and torch.equal(item["loss_mask"], ref["loss_mask"])
        online = features.compute(target, ref["input_ids"][None], torch.ones_like(ref["input_ids"])[None],
                                  {"aux_hidden_states", "last_hidden_state"}, LAYERS)
        assert item["aux_hidden_states"].shape == (len(ref["input_ids"]), 3 * 32)
        torch.testing.assert_close(item["aux_hidden_states"], online["aux_hidden_states"][0], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(item["last_hidden_state"], online["last_hidden_state"][0], atol=1e-5, rtol=1e-5)
    batch = collate([cached[0], cached[3]], pad_id=0)
    assert batch["aux_hidden_states"].shape == (2, len(ds[3]["input_ids"]), 96)
    done = features.complete(target, batch, REQUIRED, LAYERS)  # logits replayed from last_hidden_state
    assert done["target_logits"].shape == (2, len(ds[3]["input_ids"]), target.vocab_size)


def test_cache_refuses_another_target_or_layer_set(tmp_path, target):
    feature_cache.build(target, _dataset(3), str(tmp_path), LAYERS, "bfloat16", shard_rows=2, required=REQUIRED,
                        log=lambda *_: None)
    other = tiny_target(num_layers=3, hidden=32, seed=1)
    with pytest.raises(ValueError, match=rf"{target.fingerprint}.*{other.fingerprint}.*draftsmith prepare .* --features"):
        feature_cache.open(str(tmp_path), other, LAYERS)
    with pytest.raises(ValueError, match=r"layers \[0, 1, 2\], the drafter needs \[0, 2, 2\].*--features"):
        feature_cache.open(str(tmp_path), target, [0, 2, 2])
    assert feature_cache.open(str(tmp_path), target, LAYERS)[0]["aux_hidden_states"].dtype == torch.bfloat16
    with pytest.raises(ValueError, match="another build"):  # building over it with other layers is refused too
        feature_cache.build(target, _dataset(3), str(tmp_path), [1, 2, 2], "bfloat16", shard_rows=2,
                            required=REQUIRED, log=lambda *_: None)
    with pytest.raises(FileNotFoundError, match="--features"):
        feature_cache.open(str(tmp_path / "none"), target, LAYERS)


def test_interrupted_build_resumes_without_rewriting_finished_shards(tmp_path, target, monkeypatch):
    ds = _dataset(5)
    calls = []
    real = feature_cache._shard_tensors

    def dying(target_, dataset, start, *args):
        calls.append(start)
        if start == 4:
            raise KeyboardInterrupt  # killed while computing the last shard
        return real(target_, dataset, start, *args)

    monkeypatch.setattr(feature_cache, "_shard_tensors", dying)
    with pytest.raises(KeyboardInterrupt):
        feature_cache.build(target, ds, str(tmp_path), LAYERS, "float32", shard_rows=2, required=REQUIRED,
                            log=lambda *_: None)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert not manifest["complete"] and [s["start"] for s in manifest["shards"]] == [0, 2]
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(ValueError, match="incomplete"):
        feature_cache.open(str(tmp_path), target, LAYERS)
    stamps = {p.name: os.stat(p).st_mtime_ns for p in tmp_path.glob("shard_*")}
    monkeypatch.setattr(feature_cache, "_shard_tensors", lambda *a: calls.append(a[2]) or real(*a))
    calls.clear()
    manifest = feature_cache.build(target, ds, str(tmp_path), LAYERS, "float32", shard_rows=2, required=REQUIRED,
                                   log=lambda *_: None)
    assert calls == [4] and manifest["complete"] and manifest["rows"] == 5
    assert all(os.stat(tmp_path / name).st_mtime_ns == t for name, t in stamps.items())
    cached = feature_cache.open(str(tmp_path), target, LAYERS)
    assert [len(cached[i]["input_ids"]) for i in range(5)] == [len(x) for x in ds.input_ids]


def test_rows_batched_by_length_keep_their_own_features(tmp_path, target):
    """Micro-batches are formed shortest first inside a shard; every row is still stored under its own index."""
    g = torch.Generator().manual_seed(1)
    lengths = [17, 3, 11, 5, 14, 4]  # batching by length reorders them
    ids = [torch.randint(3, 250, (n,), generator=g, dtype=torch.int32) for n in lengths]
    ds = TokenDataset(ids, [torch.ones(n, dtype=torch.uint8) for n in lengths], [f"r{i}" for i in range(6)])
    feature_cache.build(target, ds, str(tmp_path), LAYERS, "float32", shard_rows=6, required=REQUIRED, batch_size=2,
                        log=lambda *_: None)
    cached = feature_cache.open(str(tmp_path), target, LAYERS, REQUIRED)
    for i, n in enumerate(lengths):
        online = features.compute(target, ids[i][None], torch.ones(1, n, dtype=torch.long),
                                  {"aux_hidden_states"}, LAYERS)
        assert torch.equal(cached[i]["input_ids"], ids[i])
        torch.testing.assert_close(cached[i]["aux_hidden_states"], online["aux_hidden_states"][0], atol=1e-5, rtol=1e-5)


def test_a_cache_built_in_bf16_serves_the_fp32_target_and_says_so(tmp_path):
    """features.build_dtype: the target runs cast (checkpoint.run_in_dtype) but keeps the fingerprint of its
    weights as loaded, so the fp32 recipe trains on the cache; each shard records the dtype it was built in."""
    from draftsmith.checkpoint import run_in_dtype

    fp32 = tiny_target(num_layers=3, hidden=32, seed=0)
    cast = tiny_target(num_layers=3, hidden=32, seed=0)
    run_in_dtype(cast, "bfloat16")
    assert cast.dtype == torch.bfloat16 and cast.fingerprint == fp32.fingerprint
    manifest = feature_cache.build(cast, _dataset(4), str(tmp_path), LAYERS, "int8", shard_rows=2, required=REQUIRED,
                                   log=lambda *_: None)
    assert [s["build_dtype"] for s in manifest["shards"]] == ["bfloat16", "bfloat16"]
    cached = feature_cache.open(str(tmp_path), fp32, LAYERS, REQUIRED)
    ref = features.compute(fp32, _dataset(4)[3]["input_ids"][None], torch.ones(1, 13, dtype=torch.long),
                           {"aux_hidden_states"}, LAYERS)["aux_hidden_states"][0]
    got = cached[3]["aux_hidden_states"].float()
    assert float((got - ref).abs().max()) < 0.05 * float(ref.abs().max())  # bf16 forward + int8 storage, same states
