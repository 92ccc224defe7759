"""Offline feature cache: the target's hidden states for every training row, computed once
(`draftsmith prepare recipe.yaml --features`) and read back by training with features.mode=offline.

Layout of cache_dir:
  manifest.json            target name + fingerprint, layers, dtype, features, rows, token counts,
                           data fingerprint, shards [{file, start, end, tokens, loss_tokens}], complete
  shard_00000.safetensors  rows [start, end): tensors "{row}/input_ids", "{row}/loss_mask",
                           "{row}/aux_hidden_states" [s, n*h], "{row}/last_hidden_state" [s, h]
Resumable: shards listed in the manifest are kept; each shard is written to a temporary file
and moved into place with os.replace, then the manifest is rewritten (also atomically).
target_logits are not stored: features.complete() recomputes them from last_hidden_state.

Compact caches (features.dtype int8 or fp8): each feature is stored quantised with one scale per
token and per target layer ("{row}/{name}" int8 / float8_e4m3fn [s, n*h], "{row}/{name}.scale"
fp32 [s, n]: absmax / 127 or / 448), about half of bf16's bytes; rows are dequantised to bf16 on
read. `predict_bytes` gives a cache's size before it is built (`draftsmith prepare --dry-run`).
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftsmith.core.errors import UserError
from draftsmith.core.files import disk_full_guard
from draftsmith.data import features as feats_mod
from draftsmith.data.dataset import collate

FORMAT_VERSION = 1
CACHEABLE = ("aux_hidden_states", "last_hidden_state")
DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
          "float32": torch.float32, "fp32": torch.float32, "int8": torch.int8, "fp8": torch.float8_e4m3fn,
          "float8_e4m3fn": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # quantised dtypes: the largest stored magnitude
ROW_BYTES = 4 + 1  # input_ids int32 + loss_mask uint8 per token


def quantize(x: torch.Tensor, dtype: torch.dtype, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """[s, n*block] -> (q [s, n*block] in dtype, scale [s, n] fp32): one absmax scale per token and block."""
    s = x.shape[0]
    xb = x.float().reshape(s, -1, block)  # [s, n*h] -> [s, n, h]
    scale = (xb.abs().amax(-1) / QMAX[dtype]).clamp_min(1e-12)  # [s, n]
    y = xb / scale[..., None]
    q = y.round().clamp(-127, 127).to(dtype) if dtype == torch.int8 else y.to(dtype)
    return q.reshape(s, -1), scale


def dequantize(q: torch.Tensor, scale: torch.Tensor, out_dtype=torch.bfloat16) -> torch.Tensor:
    """(q [s, n*h], scale [s, n]) -> [s, n*h] in out_dtype."""
    s, n = scale.shape
    return (q.float().reshape(s, n, -1) * scale[..., None]).reshape(s, -1).to(out_dtype)


def predict_bytes(tokens: int, rows: int, features: list[str], num_aux_layers: int, hidden: int, dtype: str) -> dict:
    """Bytes a cache of `rows` rows and `tokens` tokens will take (tensor payload, which dominates;
    safetensors headers add ~100 bytes per row and tensor). -> {"per_token": ..., "total": ...}."""
    t = DTYPES[dtype]
    elem = torch.empty(0, dtype=t).element_size()
    per_token = ROW_BYTES
    for name in features:
        blocks = num_aux_layers if name == "aux_hidden_states" else 1
        per_token += blocks * hidden * elem + (blocks * 4 if t in QMAX else 0)
    return {"per_token": per_token, "total": per_token * tokens + 100 * rows * (2 + 2 * len(features))}
REBUILD = "rebuild it with `draftsmith prepare recipe.yaml --features` (or point features.cache_dir elsewhere)"


def cache_features(required: Iterable[str]) -> list[str]:
    """The hidden-state features to store for a drafter's required features."""
    req = set(required)
    out = ["aux_hidden_states"] if "aux_hidden_states" in req else []
    if req & {"last_hidden_state", "target_logits"}:
        out.append("last_hidden_state")
    return out


def data_fingerprint(dataset) -> str:
    h = hashlib.sha256()
    for i in range(len(dataset)):
        item = dataset[i]
        h.update(item["input_ids"].to(torch.int64).numpy().tobytes())
        h.update(item["loss_mask"].to(torch.int64).numpy().tobytes())
    return h.hexdigest()[:16]


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    os.replace(tmp, path)


def _write_shard(root: Path, name: str, tensors: dict, metadata: dict) -> None:
    """One shard, written aside and renamed into place; a full disk is one line naming the cache (the
    shards already written stay, and a rerun of `prepare --features` resumes after them)."""
    tmp = root / (name + ".tmp")
    try:
        with disk_full_guard(root, f"feature cache shard {name} (features.cache_dir)"):
            save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, root / name)
    finally:
        tmp.unlink(missing_ok=True)


def _expected(target, dataset, layers, dtype, shard_rows, features) -> dict:
    return {"format_version": FORMAT_VERSION, "target": target.name, "target_fingerprint": target.fingerprint,
            "layers": list(layers), "dtype": str(DTYPES[dtype]).replace("torch.", ""), "features": features,
            "rows": len(dataset), "shard_rows": shard_rows, "data_fingerprint": data_fingerprint(dataset),
            "hidden_size": target.hidden_size}


def _shard_tensors(target, dataset, start: int, end: int, layers, dtype, features, batch_size: int) -> dict:
    """Forward rows [start, end) in right-padded micro-batches of similar length (little padding);
    keep each row's own length."""
    out: dict[str, torch.Tensor] = {}
    pad = target.tokenizer.pad_token_id or 0
    order = sorted(range(start, end), key=lambda i: len(dataset[i]["input_ids"]))
    for lo in range(0, len(order), batch_size):
        rows = order[lo:lo + batch_size]
        items = [dataset[i] for i in rows]
        batch = collate(items, pad)
        check = lo == 0 and "last_hidden_state" in features  # once per shard: the soft labels' path
        f = feats_mod.compute(target, batch["input_ids"].to(target.device), batch["attention_mask"].to(target.device),
                              set(features) | ({"target_logits"} if check else set()), list(layers))
        if check:
            feats_mod.check_logits_path(target, f["last_hidden_state"], f["target_logits"], batch["attention_mask"])
        for b, (row, item) in enumerate(zip(rows, items)):
            n = len(item["input_ids"])
            out[f"{row}/input_ids"] = item["input_ids"].to(torch.int32)
            out[f"{row}/loss_mask"] = item["loss_mask"].to(torch.uint8)
            for name in features:
                x = f[name][b, :n].to("cpu")  # [s_pad, d] -> [s, d]
                if DTYPES[dtype] in QMAX:
                    q, scale = quantize(x, DTYPES[dtype], target.hidden_size)
                    out[f"{row}/{name}"], out[f"{row}/{name}.scale"] = q.contiguous(), scale.contiguous()
                else:
                    out[f"{row}/{name}"] = x.to(DTYPES[dtype]).contiguous()
    return out


def build(target, dataset, cache_dir: str, layers: list[int], dtype: str = "bfloat16", shard_rows: int = 256,
          required: Iterable[str] = CACHEABLE, batch_size: int = 8, log=print) -> dict:
    """Write (or finish) the cache for `dataset` under cache_dir; returns the manifest."""
    features = cache_features(required)
    if not features:
        raise UserError(f"nothing to cache: required features {sorted(required)} include none of {CACHEABLE}")
    if dtype not in DTYPES:
        raise UserError(f"features.dtype {dtype!r} is not one of {sorted(DTYPES)}")
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    manifest_path = root / "manifest.json"
    expected = _expected(target, dataset, layers, dtype, shard_rows, features)
    manifest = {**expected, "shards": [], "tokens": 0, "loss_tokens": 0, "complete": False}
    if manifest_path.exists():
        old = json.loads(manifest_path.read_text())
        diff = {k: (old.get(k), v) for k, v in expected.items() if old.get(k) != v}
        if diff:
            raise UserError(f"{manifest_path} belongs to another build {diff} (cached, now): delete {root} "
                             "(or set features.cache_dir to a new directory) and rerun "
                             "`draftsmith prepare recipe.yaml --features`")
        manifest = old
    done = {s["start"] for s in manifest["shards"] if (root / s["file"]).exists()}
    manifest["shards"] = [s for s in manifest["shards"] if s["start"] in done]
    for start in range(0, len(dataset), shard_rows):
        if start in done:
            continue
        end = min(len(dataset), start + shard_rows)
        tensors = _shard_tensors(target, dataset, start, end, layers, dtype, features, batch_size)
        name = f"shard_{start // shard_rows:05d}.safetensors"
        _write_shard(root, name, tensors, {"start": str(start), "end": str(end)})
        tokens = sum(len(dataset[i]["input_ids"]) for i in range(start, end))
        loss = sum(int(dataset[i]["loss_mask"].sum()) for i in range(start, end))
        manifest["shards"].append({"file": name, "start": start, "end": end, "tokens": tokens, "loss_tokens": loss,
                                   "build_dtype": str(target.dtype).replace("torch.", "")})
        manifest["shards"].sort(key=lambda s: s["start"])
        manifest["tokens"] = sum(s["tokens"] for s in manifest["shards"])
        manifest["loss_tokens"] = sum(s["loss_tokens"] for s in manifest["shards"])
        manifest["complete"] = sum(s["end"] - s["start"] for s in manifest["shards"]) == len(dataset)
        _write_json(manifest_path, manifest)
        log(f"feature cache: {name} rows [{start}, {end}) written")
    manifest["complete"] = True
    _write_json(manifest_path, manifest)
    return manifest


class CachedDataset(torch.utils.data.Dataset):
    """Rows of a feature cache: {"input_ids", "loss_mask", "id", <cached features>} per item."""

    def __init__(self, root: Path, manifest: dict, start: int = 0, end: Optional[int] = None):
        self.root, self.manifest = root, manifest
        self.start, self.end = start, manifest["rows"] if end is None else end
        self._handles: dict[str, object] = {}
        self._shard_of = {}
        for s in manifest["shards"]:
            for r in range(s["start"], s["end"]):
                self._shard_of[r] = s["file"]

    def __len__(self) -> int:
        return self.end - self.start

    def subset(self, start: int, end: int) -> "CachedDataset":
        return CachedDataset(self.root, self.manifest, self.start + start, self.start + end)

    def lengths(self) -> list[int]:
        """Token count of every row (from the manifest-listed shards, without reading features)."""
        out = []
        for i in range(len(self)):
            row = self.start + i
            file = self._shard_of[row]
            if file not in self._handles:
                self._handles[file] = safe_open(str(self.root / file), framework="pt")
            out.append(self._handles[file].get_slice(f"{row}/input_ids").get_shape()[0])
        return out

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        row = self.start + i
        file = self._shard_of[row]
        if file not in self._handles:
            self._handles[file] = safe_open(str(self.root / file), framework="pt")
        h = self._handles[file]
        item = {"input_ids": h.get_tensor(f"{row}/input_ids").long(), "loss_mask": h.get_tensor(f"{row}/loss_mask").long(),
                "id": f"cache:{row}"}
        quantized = DTYPES[self.manifest["dtype"]] in QMAX
        for name in self.manifest["features"]:
            item[name] = h.get_tensor(f"{row}/{name}")
            if quantized:
                item[name] = dequantize(item[name], h.get_tensor(f"{row}/{name}.scale"))
        return item


def open(cache_dir: str, target, layers: list[int], required: Optional[Iterable[str]] = None) -> CachedDataset:  # noqa: A001
    """Open a finished cache built for this target and layer set (ValueError otherwise)."""
    root = Path(cache_dir)
    path = root / "manifest.json"
    if not path.exists():
        raise FileNotFoundError(f"no feature cache at {root} (missing manifest.json): build it with "
                                "`draftsmith prepare recipe.yaml --features`")
    manifest = json.loads(path.read_text())
    if not target.matches(manifest.get("target_fingerprint")):
        raise UserError(f"feature cache {root} was built for target {manifest.get('target')!r} (fingerprint "
                         f"{manifest.get('target_fingerprint')}), not {target.name!r} (fingerprint {target.fingerprint}); "
                         + REBUILD)
    if manifest.get("layers") != list(layers):
        raise UserError(f"feature cache {root} holds layers {manifest.get('layers')}, the drafter needs {list(layers)}; "
                         + REBUILD)
    if not manifest.get("complete"):
        raise UserError(f"feature cache {root} is incomplete ({len(manifest['shards'])} shard(s) written); "
                         "finish it with `draftsmith prepare recipe.yaml --features` (it resumes)")
    missing = set(cache_features(required or [])) - set(manifest["features"])
    if missing:
        raise UserError(f"feature cache {root} lacks {sorted(missing)} (has {manifest['features']}); " + REBUILD)
    return CachedDataset(root, manifest)
