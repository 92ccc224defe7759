"""Offline feature cache: the target's hidden states for every training row, computed once
(`draftsmith prepare recipe.yaml --features`) and read back by training with features.mode=offline.

Layout of cache_dir:
  manifest.json            target name + fingerprint, layers, dtype, features, rows, token counts,
                           data fingerprint, shards [{file, start, end, tokens, loss_tokens}], complete
  shard_00000.safetensors  rows [start, end): tensors "{row}/input_ids", "{row}/loss_mask",
                           "{row}/aux_hidden_states" [s, n*h], "{row}/last_hidden_state" [s, h]
A row with images (a vision-language target) is cached as the target computed it from its pixels: the
vision tower runs once per row, at build time; training reads the features and never runs the target.
Resumable: shards listed in the manifest are kept; each shard is written to a temporary file
and moved into place with os.replace, then the manifest is rewritten (also atomically).
target_logits are not stored: features.complete() recomputes them from last_hidden_state.

Top-K logits (features.label_topk K; manifest format_version 3 with "label_topk": K): each row also holds
"{row}/label_topk_ids" int32 [s, K], the target ids of its K largest logits (from the target's own forward,
out.logits), largest first, and "{row}/label_topk_values" float16 [s, K], those logits minus the largest
(data/features.top_logits says why float16). Training with the same K reads them instead of replaying the
lm_head (features.complete -> data.features.TopKLogits -> heads/vocab_loss.soft_labels); training with
label_topk null ignores them and replays as before (the hidden states are all still there). A cache
without them, or with another K, is refused in one line; the ids are checked against the target's
vocabulary and the values for finiteness as each row is read.

Compact caches (features.dtype int8 or fp8): each feature is stored quantised with one scale per
token and per target layer ("{row}/{name}" int8 / float8_e4m3fn [s, n*h], "{row}/{name}.scale"
fp32 [s, n]: absmax / 127 or / 448), about half of bf16's bytes; rows are dequantised to bf16 on
read. `predict_bytes` gives a cache's size before it is built (`draftsmith prepare --dry-run`).
"""
from __future__ import annotations

import bisect
import hashlib
import os
from pathlib import Path
from typing import Iterable, Optional

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from draftsmith.core.errors import UserError
from draftsmith.core.files import disk_full_guard
from draftsmith.data import feature_manifest as fm
from draftsmith.data import features as feats_mod
from draftsmith.data.dataset import collate

FORMAT_VERSION = fm.FORMAT_VERSION
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


TOPK_BYTES = 4 + 2  # per top-K entry: an int32 id and a float16 value


def predict_bytes(tokens: int, rows: int, features: list[str], num_aux_layers: int, hidden: int, dtype: str,
                  label_topk: Optional[int] = None) -> dict:
    """Bytes a cache of `rows` rows and `tokens` tokens will take (tensor payload, which dominates;
    safetensors headers add ~100 bytes per row and tensor). -> {"per_token": ..., "total": ...}."""
    t = DTYPES[dtype]
    elem = torch.empty(0, dtype=t).element_size()
    per_token = ROW_BYTES + (label_topk or 0) * TOPK_BYTES
    for name in features:
        blocks = num_aux_layers if name == "aux_hidden_states" else 1
        per_token += blocks * hidden * elem + (blocks * 4 if t in QMAX else 0)
    tensors = 2 + 2 * len(features) + (len(feats_mod.TOPK_FEATURES) if label_topk else 0)
    return {"per_token": per_token, "total": per_token * tokens + 100 * rows * tensors}
REBUILD = "rebuild it with `draftsmith prepare recipe.yaml --features` (or point features.cache_dir elsewhere)"


def cache_features(required: Iterable[str]) -> list[str]:
    """The hidden-state features to store for a drafter's required features."""
    req = set(required)
    out = ["aux_hidden_states"] if "aux_hidden_states" in req else []
    if req & {"last_hidden_state", "target_logits"}:
        out.append("last_hidden_state")
    return out


def data_fingerprint(dataset) -> str:
    """Over every row's ids and mask, and an image row's pixels (the same text with another image is other data)."""
    h = hashlib.sha256()
    for i in range(len(dataset)):
        item = dataset[i]
        h.update(item["input_ids"].to(torch.int64).numpy().tobytes())
        h.update(item["loss_mask"].to(torch.int64).numpy().tobytes())
        for key, value in sorted((item.get("media") or {}).items()):
            h.update(key.encode())
            h.update(value.float().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def _write_shard(root: Path, name: str, tensors: dict, metadata: dict) -> tuple[int, str]:
    """One shard, written aside and renamed into place; -> (bytes, sha256) of what was written. A full disk
    is one line naming the cache (the shards already written stay, and a rerun resumes after them)."""
    tmp = root / f"{name}.tmp"  # one writer: the holder of the shard lock
    try:
        with disk_full_guard(root, f"feature cache shard {name} (features.cache_dir)"):
            save_file(tensors, str(tmp), metadata=metadata)
        size = tmp.stat().st_size
        digest = fm.file_digest(tmp, size)
        os.replace(tmp, root / name)
    finally:
        tmp.unlink(missing_ok=True)
    return digest


def _expected(target, dataset, layers, dtype, shard_rows, features, label_topk: Optional[int] = None) -> dict:
    expected = {"format_version": fm.format_version(label_topk), "target": target.name,
                "target_fingerprint": target.fingerprint, "layers": list(layers),
                "dtype": str(DTYPES[dtype]).replace("torch.", ""), "features": features, "rows": len(dataset),
                "shard_rows": shard_rows, "data_fingerprint": data_fingerprint(dataset), "hidden_size": target.hidden_size}
    return expected if label_topk is None else {**expected, "label_topk": label_topk}


def _shard_tensors(target, dataset, start: int, end: int, layers, dtype, features, batch_size: int,
                   label_topk: Optional[int] = None) -> dict:
    """Forward rows [start, end) in right-padded micro-batches of similar length (little padding);
    keep each row's own length. label_topk K: also each row's top-K logits from the forward's own logits."""
    out: dict[str, torch.Tensor] = {}
    pad = target.tokenizer.pad_token_id or 0
    order = sorted(range(start, end), key=lambda i: len(dataset[i]["input_ids"]))
    for lo in range(0, len(order), batch_size):
        rows = order[lo:lo + batch_size]
        items = [dataset[i] for i in rows]
        batch = collate(items, pad)
        check = lo == 0 and "last_hidden_state" in features  # once per shard: the soft labels' path
        media = {k: v.to(target.device) for k, v in feats_mod.media_of(batch).items()}  # image rows: the vision tower runs here
        f = feats_mod.compute(target, batch["input_ids"].to(target.device), batch["attention_mask"].to(target.device),
                              set(features) | ({"target_logits"} if check or label_topk else set()), list(layers),
                              media=media)
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
            if label_topk:  # [s_pad, V] -> [s, K] ids and gaps, from the target's own logits
                ids, values = feats_mod.top_logits(f["target_logits"][b, :n], label_topk)
                for key, value in zip(feats_mod.TOPK_FEATURES, (ids, values)):
                    out[f"{row}/{key}"] = value.to("cpu").contiguous()
    return out


def shard_order(num_shards: int, rank: int, world: int) -> list[int]:
    """The order in which one builder tries the shards: its own (index % world == rank) first, then the
    others' (a shard whose builder died or is slow is taken over). Which builder writes a shard is decided
    by its lock, not by this order, so any rank count resumes any cache."""
    mine = [i for i in range(num_shards) if i % world == rank]
    return mine + [i for i in range(num_shards) if i % world != rank]


def _start(root: Path, expected: dict) -> dict:
    """The cache's manifest, started when absent; one line when it belongs to another build."""
    with fm.lock(root, "manifest"):
        old = fm.read_manifest(root)
        if old is None:
            fm.write_manifest(root, {**expected, "shards": [], "tokens": 0, "loss_tokens": 0, "complete": False})
            return fm.read_manifest(root)
    diff = {k: (old.get(k), expected.get(k)) for k in [*expected, "label_topk"] if old.get(k) != expected.get(k)}
    if diff:
        raise UserError(f"{root / fm.MANIFEST} belongs to another build {diff} (cached, now): delete {root} "
                        "(or set features.cache_dir to a new directory) and rerun "
                        "`draftsmith prepare recipe.yaml --features`")
    return old


def _merge(root: Path, entry: dict) -> dict:
    """Add one finished shard to the manifest: read, replace that shard's entry, write aside, rename."""
    with fm.lock(root, "manifest"):
        manifest = fm.read_manifest(root)
        manifest["shards"] = [s for s in manifest["shards"] if s["start"] != entry["start"]] + [entry]
        fm.write_manifest(root, manifest)
        return fm.read_manifest(root)


def _drop(root: Path, start: int) -> None:
    with fm.lock(root, "manifest"):
        manifest = fm.read_manifest(root)
        manifest["shards"] = [s for s in manifest["shards"] if s["start"] != start]
        fm.write_manifest(root, manifest)


def build(target, dataset, cache_dir: str, layers: list[int], dtype: str = "bfloat16", shard_rows: int = 256,
          required: Iterable[str] = CACHEABLE, batch_size: int = 8, log=print, rank: int = 0, world: int = 1,
          label_topk: Optional[int] = None) -> dict:
    """Write (or finish) the cache for `dataset` under cache_dir; returns the manifest.

    label_topk K (features.label_topk): each row also holds the target's top-K logits (manifest version 3).

    rank / world: this builder's place among `world` builders sharing the cache (prepare --nproc, torchrun).
    Each shard is built by whichever builder holds its lock; a finished shard listed in the manifest is kept
    when its size and sha256 still match, and rebuilt otherwise."""
    features = cache_features(required)
    if not features:
        raise UserError(f"nothing to cache: required features {sorted(required)} include none of {CACHEABLE}")
    if dtype not in DTYPES:
        raise UserError(f"features.dtype {dtype!r} is not one of {sorted(DTYPES)}")
    if label_topk is not None and not 1 <= label_topk <= target.vocab_size:
        raise UserError(f"features.label_topk {label_topk}: must lie in [1, {target.vocab_size:,}], the target's "
                        "vocabulary size")
    root = Path(cache_dir)
    root.mkdir(parents=True, exist_ok=True)
    expected = _expected(target, dataset, layers, dtype, shard_rows, features, label_topk)
    manifest = _start(root, expected)
    num_shards = -(-len(dataset) // shard_rows)
    built = 0
    for index in shard_order(num_shards, rank, world):
        start, end, name = index * shard_rows, min(len(dataset), (index + 1) * shard_rows), fm.shard_name(index)
        with fm.lock(root, name, wait=False) as held:
            if not held:
                continue  # another builder is writing it
            manifest = fm.read_manifest(root)
            entry = next((s for s in manifest["shards"] if s["start"] == start), None)
            if entry is not None:
                why = fm.shard_damage(root, entry)
                if why is None:
                    continue
                log(f"feature cache: {name} is damaged ({why}); rebuilding it")
                _drop(root, start)
            elif fm.regular_shard(root, {"file": name}) is not None:
                log(f"feature cache: {name} is not in the manifest (a build stopped before recording it); rebuilding it")
            tensors = _shard_tensors(target, dataset, start, end, layers, dtype, features, batch_size, label_topk)
            size, digest = _write_shard(root, name, tensors, {"start": str(start), "end": str(end)})
            tokens = sum(len(dataset[i]["input_ids"]) for i in range(start, end))
            loss = sum(int(dataset[i]["loss_mask"].sum()) for i in range(start, end))
            manifest = _merge(root, {"file": name, "start": start, "end": end, "tokens": tokens, "loss_tokens": loss,
                                     "build_dtype": str(target.dtype).replace("torch.", ""), "size": size,
                                     "sha256": digest})
            built += 1
            log(f"feature cache: {name} rows [{start}, {end}) written" + (f" (rank {rank} of {world})" if world > 1 else ""))
    manifest = fm.read_manifest(root)
    if not manifest["complete"] and world == 1:
        raise UserError(f"feature cache {root}: another builder still holds a shard; wait for it to finish and rerun "
                        "`draftsmith prepare recipe.yaml --features`")
    return manifest


class CachedDataset(torch.utils.data.Dataset):
    """Rows of a feature cache: {"input_ids", "loss_mask", "id", <cached features>} per item. Each shard's
    header is checked (fm.check_shard_header) before the first read from it. topk_vocab V (features.label_topk):
    items also hold the row's top-K logits (features.TOPK_FEATURES), their ids checked to lie in [0, V)."""

    def __init__(self, root: Path, manifest: dict, start: int = 0, end: Optional[int] = None,
                 topk_vocab: Optional[int] = None):
        self.root, self.manifest, self.topk_vocab = root, manifest, topk_vocab
        self.start, self.end = start, manifest["rows"] if end is None else end
        self._handles: dict[str, object] = {}
        self._shards = sorted(manifest["shards"], key=lambda s: s["start"])
        self._starts = [s["start"] for s in self._shards]

    def __len__(self) -> int:
        return self.end - self.start

    def subset(self, start: int, end: int) -> "CachedDataset":
        return CachedDataset(self.root, self.manifest, self.start + start, self.start + end, self.topk_vocab)

    def _handle(self, row: int):
        entry = self._shards[bisect.bisect_right(self._starts, row) - 1]
        file = entry["file"]
        if file not in self._handles:
            fm.check_shard_header(self.root, entry, self.manifest)
            self._handles[file] = safe_open(str(self.root / file), framework="pt")
        return self._handles[file]

    def lengths(self) -> list[int]:
        """Token count of every row (from the manifest-listed shards, without reading features)."""
        return [self._handle(self.start + i).get_slice(f"{self.start + i}/input_ids").get_shape()[0]
                for i in range(len(self))]

    def __getitem__(self, i: int) -> dict:
        if not 0 <= i < len(self):
            raise IndexError(i)
        row = self.start + i
        h = self._handle(row)
        item = {"input_ids": h.get_tensor(f"{row}/input_ids").long(), "loss_mask": h.get_tensor(f"{row}/loss_mask").long(),
                "id": f"cache:{row}"}
        quantized = DTYPES[self.manifest["dtype"]] in QMAX
        for name in self.manifest["features"]:
            item[name] = h.get_tensor(f"{row}/{name}")
            if quantized:
                item[name] = dequantize(item[name], h.get_tensor(f"{row}/{name}.scale"))
        if self.topk_vocab is not None:
            item.update(self._top_logits(h, row))
        return item

    def _top_logits(self, h, row: int) -> dict:
        """The row's cached top-K logits, checked: ids inside the target's vocabulary, finite values."""
        ids, values = (h.get_tensor(f"{row}/{name}") for name in feats_mod.TOPK_FEATURES)
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= self.topk_vocab
                            or not bool(torch.isfinite(values).all())):
            entry = self._shards[bisect.bisect_right(self._starts, row) - 1]
            raise UserError(f"feature cache shard {self.root / entry['file']}: row {row}'s top-K logits hold an id "
                            f"outside the target's vocabulary [0, {self.topk_vocab:,}) or a value that is not finite; "
                            f"the cache is damaged: {fm.DELETE}")
        return dict(zip(feats_mod.TOPK_FEATURES, (ids, values)))


def open(cache_dir: str, target, layers: list[int], required: Optional[Iterable[str]] = None,  # noqa: A001
         label_topk: Optional[int] = None) -> CachedDataset:
    """Open a finished cache built for this target and layer set (ValueError otherwise); label_topk K: one that
    holds the target's top-K logits for that K, read with every row."""
    root = Path(cache_dir)
    manifest = fm.read_manifest(root)
    if manifest is None:
        raise FileNotFoundError(f"no feature cache at {root} (missing manifest.json): build it with "
                                "`draftsmith prepare recipe.yaml --features`")
    if not target.matches(manifest.get("target_fingerprint")):
        raise UserError(f"feature cache {root} was built for target {manifest.get('target')!r} (fingerprint "
                         f"{manifest.get('target_fingerprint')}), not {target.name!r} (fingerprint {target.fingerprint}); "
                         + REBUILD)
    if manifest.get("layers") != list(layers):
        raise UserError(f"feature cache {root} holds layers {manifest.get('layers')}, the drafter needs {list(layers)}; "
                         + REBUILD)
    if manifest.get("hidden_size") != target.hidden_size:
        raise UserError(f"feature cache {root} holds hidden size {manifest.get('hidden_size')}, the target's is "
                        f"{target.hidden_size}; " + REBUILD)
    if label_topk is not None and manifest.get("label_topk") != label_topk:
        held = "no top-K logits" if manifest.get("label_topk") is None else f"top-{manifest['label_topk']} logits"
        raise UserError(f"feature cache {root} holds {held}, features.label_topk is {label_topk}: {fm.DELETE}")
    if not manifest.get("complete"):
        raise UserError(f"feature cache {root} is incomplete ({len(manifest['shards'])} shard(s) written); "
                         "finish it with `draftsmith prepare recipe.yaml --features` (it resumes)")
    missing = set(cache_features(required or [])) - set(manifest["features"])
    if missing:
        raise UserError(f"feature cache {root} lacks {sorted(missing)} (has {manifest['features']}); " + REBUILD)
    for entry in manifest["shards"]:  # cheap checks of every shard before training starts
        st = fm.regular_shard(root, entry)
        if st is None or st.st_size != entry["size"]:
            found = "missing" if st is None else f"{st.st_size:,} bytes, the manifest recorded {entry['size']:,}"
            raise UserError(f"feature cache shard {root / entry['file']}: {found}; finish the cache with "
                            "`draftsmith prepare recipe.yaml --features` (it rebuilds damaged shards)")
    return CachedDataset(root, manifest, topk_vocab=None if label_topk is None else target.vocab_size)
