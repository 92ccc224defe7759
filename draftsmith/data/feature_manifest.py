"""The feature cache's manifest and shards as received files: the one reader and the one writer of
manifest.json, the per-shard checks, and the locks that let several builders share one cache.

A cache may have been copied from elsewhere, so everything in it is checked before it is used:
  - manifest.json is read bounded (a regular file of at most MAX_JSON_BYTES; a link to /dev/zero or a
    FIFO is one line), must be a JSON object, and every key has its type and range checked
    (`check_manifest`): one line naming the manifest and the key, never a traceback;
  - a shard entry names a file by its own bare name (`shard_00003.safetensors` for start 3 *
    shard_rows), so no entry reaches outside the cache; start/end lie inside [0, rows) on the shard
    grid; the shards never overlap; `complete`, `rows`, `tokens` and `loss_tokens` must agree with
    the shards listed;
  - each shard records its byte size and sha256 when written. `prepare --features` checks both
    before it keeps a finished shard (a truncated, empty or swapped shard is rebuilt); training
    checks the size at open and each shard's safetensors header (its row range and every row's
    tensors, dtypes and shapes) before the first read from it. A shard that is not a regular file
    (a FIFO, a device, a link) is refused in one line, never read or replaced.

Format versions: 2, the cache of hidden states (written byte for byte as before version 3 existed when
features.label_topk is null); 3, a cache that also holds the target's top-K logits per row, with K recorded
as label_topk (a version 2 manifest has no label_topk, a version 3 manifest must have one).

Several builders (ranks of `prepare --features --nproc N` or torchrun, or two commands by mistake)
share a cache through file locks (fcntl.flock) under .locks/: one per shard, held while the shard is
built, and one for the manifest, held while a finished shard is merged into it (read, add, write
aside, rename). The kernel drops a lock when its process dies, so a SIGKILLed builder leaves no
stale claim: its unfinished shard is simply built again later.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import re
import stat
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.core.files import check_safetensors, file_kind, read_json_object
from draftsmith.data.features import TOPK_FEATURES

FORMAT_VERSION = 2  # 2: shards record size and sha256
TOPK_FORMAT_VERSION = 3  # 3: version 2 + label_topk, each row's top-K logits (features.label_topk)
MAX_LABEL_TOPK = 1 << 20  # K a cache may declare
MAX_ROWS = 10**9  # rows a cache may declare (a manifest claiming more is damaged, not big)
MANIFEST = "manifest.json"
LOCKS = ".locks"
SHARD_NAME = re.compile(r"^shard_\d{5,9}\.safetensors$")
CACHEABLE = ("aux_hidden_states", "last_hidden_state")
# manifest dtype -> the safetensors dtype its hidden states are stored in (int8 / fp8 carry an F32 scale)
STORED = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "int8": "I8", "float8_e4m3fn": "F8_E4M3"}
DELETE = ("delete it (or set features.cache_dir to a new directory) and rebuild with "
          "`draftsmith prepare recipe.yaml --features`")


def format_version(label_topk: int | None) -> int:
    """The version a cache is written in: 2 without top-K logits, 3 with."""
    return FORMAT_VERSION if label_topk is None else TOPK_FORMAT_VERSION


def shard_name(index: int) -> str:
    return f"shard_{index:05d}.safetensors"


def _damaged(path: Path, why: str) -> UserError:
    return UserError(f"feature cache manifest {path}: {why}; the cache is damaged or not draftsmith's: {DELETE}")


def _int(path, where, value, lo, hi) -> int:
    if type(value) is not int or not lo <= value <= hi:
        raise _damaged(path, f"{where} is {str(value)[:40]!r}, not an integer in [{lo}, {hi}]")
    return value


def _text(path, where, value, limit=200) -> str:
    if not isinstance(value, str) or len(value) > limit:
        raise _damaged(path, f"{where} is {str(value)[:40]!r}, not a string of at most {limit} characters")
    return value


def check_manifest(path: Path, m: dict) -> dict:
    """Every key of a manifest, typed and ranged, and the shards consistent with rows and complete."""
    version = _int(path, "format_version", m.get("format_version"), FORMAT_VERSION, TOPK_FORMAT_VERSION)
    if version == TOPK_FORMAT_VERSION:
        _int(path, "label_topk", m.get("label_topk"), 1, MAX_LABEL_TOPK)
    elif "label_topk" in m:
        raise _damaged(path, f"label_topk is set in a format_version {version} manifest (top-K logits are version "
                             f"{TOPK_FORMAT_VERSION})")
    for key in ("target", "target_fingerprint", "data_fingerprint"):
        _text(path, key, m.get(key))
    if not isinstance(m.get("dtype"), str) or m["dtype"] not in STORED:
        raise _damaged(path, f"dtype {str(m.get('dtype'))[:40]!r} is not one of {sorted(STORED)}")
    layers = m.get("layers")
    if not isinstance(layers, list) or not layers or len(layers) > 1024:
        raise _damaged(path, f"layers is {str(layers)[:40]!r}, not a list of layer ids")
    for i, layer in enumerate(layers):
        _int(path, f"layers[{i}]", layer, 0, 100_000)
    feats = m.get("features")
    if (not isinstance(feats, list) or not feats or len(set(map(str, feats))) != len(feats)
            or not set(map(str, feats)) <= set(CACHEABLE)):
        raise _damaged(path, f"features is {str(feats)[:60]!r}, not a list drawn from {list(CACHEABLE)}")
    _int(path, "hidden_size", m.get("hidden_size"), 1, 1 << 20)
    rows = _int(path, "rows", m.get("rows"), 0, MAX_ROWS)
    per = _int(path, "shard_rows", m.get("shard_rows"), 1, MAX_ROWS)
    if type(m.get("complete")) is not bool:
        raise _damaged(path, f"complete is {str(m.get('complete'))[:40]!r}, not true or false")
    shards = m.get("shards")
    if not isinstance(shards, list):
        raise _damaged(path, f"shards is {type(shards).__name__}, not a list")
    seen, covered, tokens, loss = set(), 0, 0, 0
    for i, s in enumerate(shards):
        where = f"shards[{i}]"
        if not isinstance(s, dict):
            raise _damaged(path, f"{where} is {type(s).__name__}, not an object")
        start = _int(path, f"{where}.start", s.get("start"), 0, max(rows - 1, 0))
        end = _int(path, f"{where}.end", s.get("end"), start + 1, min(rows, start + per))
        if start % per or (end != min(rows, start + per)):
            raise _damaged(path, f"{where} covers rows [{start}, {end}), not a shard of {per} rows on the grid")
        if s.get("file") != shard_name(start // per):
            raise _damaged(path, f"{where}.file is {str(s.get('file'))[:80]!r}; the shard of rows [{start}, {end}) "
                                 f"is {shard_name(start // per)!r}, inside the cache")
        if start in seen:
            raise _damaged(path, f"{where} lists rows [{start}, {end}) a second time")
        seen.add(start)
        _int(path, f"{where}.size", s.get("size"), 8, 1 << 50)
        digest = _text(path, f"{where}.sha256", s.get("sha256"), 64)
        if not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise _damaged(path, f"{where}.sha256 is not 64 hex digits")
        tokens += _int(path, f"{where}.tokens", s.get("tokens"), end - start, 1 << 50)
        loss += _int(path, f"{where}.loss_tokens", s.get("loss_tokens"), 0, s["tokens"])
        covered += end - start
    if m["complete"] and covered != rows:
        raise _damaged(path, f"complete is true but its shards cover {covered} of its {rows} rows")
    for key, want in (("tokens", tokens), ("loss_tokens", loss)):
        if m.get(key) != want:
            raise _damaged(path, f"{key} is {str(m.get(key))[:40]!r} but its shards hold {want}")
    return m


def read_manifest(root: Path) -> dict | None:
    """The checked manifest of the cache at root, or None when there is none."""
    path = Path(root) / MANIFEST
    if not os.path.lexists(path):
        return None
    return check_manifest(path, read_json_object(path, "feature cache manifest"))


def write_manifest(root: Path, manifest: dict) -> None:
    """Write aside, then rename over manifest.json (call under manifest_lock when builders share the cache)."""
    root = Path(root)
    shards = sorted(manifest["shards"], key=lambda s: s["start"])
    manifest = {**manifest, "shards": shards, "tokens": sum(s["tokens"] for s in shards),
                "loss_tokens": sum(s["loss_tokens"] for s in shards),
                "complete": sum(s["end"] - s["start"] for s in shards) == manifest["rows"]}
    check_manifest(root / MANIFEST, manifest)  # the writer keeps the reader's promises
    tmp = root / f"{MANIFEST}.tmp"  # one writer: the holder of the manifest lock
    try:
        tmp.write_text(json.dumps(manifest, indent=2))
        os.replace(tmp, root / MANIFEST)
    finally:
        tmp.unlink(missing_ok=True)


# --------------------------------------------------------------------------- shards


def regular_shard(root: Path, entry: dict) -> os.stat_result | None:
    """lstat of a listed shard: None when missing; one line when it is a link, FIFO, device or directory."""
    path = Path(root) / entry["file"]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(st.st_mode):
        what = "a symbolic link" if stat.S_ISLNK(st.st_mode) else file_kind(st.st_mode)
        raise UserError(f"feature cache shard {path}: is {what}, not a regular file inside the cache; remove it "
                        "and rerun `draftsmith prepare recipe.yaml --features` (it rebuilds that shard)")
    return st


def file_digest(path: Path, size: int) -> tuple[int, str]:
    """(bytes, sha256) of a regular file, reading at most size + 1 bytes."""
    h, n = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while n <= size:
            block = f.read(min(1 << 20, size + 1 - n))
            if not block:
                break
            h.update(block)
            n += len(block)
    return n, h.hexdigest()


def shard_damage(root: Path, entry: dict) -> str | None:
    """Why a listed shard cannot be kept (missing, another size, another hash), or None when intact."""
    st = regular_shard(root, entry)
    if st is None:
        return "missing"
    if st.st_size != entry["size"]:
        return f"{st.st_size:,} bytes, the manifest recorded {entry['size']:,}"
    n, digest = file_digest(Path(root) / entry["file"], entry["size"])
    if n != entry["size"] or digest != entry["sha256"]:
        return "its sha256 differs from the one recorded"
    return None


def check_shard_header(root: Path, entry: dict, manifest: dict) -> None:
    """The shard's safetensors header holds rows [start, end) with every cached tensor in the manifest's
    dtype and shapes (a shard of another cache, or another shard's bytes, is one line)."""
    path = Path(root) / entry["file"]
    header = check_safetensors(path)
    meta = header.get("__metadata__") or {}
    if meta.get("start") != str(entry["start"]) or meta.get("end") != str(entry["end"]):
        raise UserError(f"feature cache shard {path}: holds rows [{str(meta.get('start'))[:20]}, "
                        f"{str(meta.get('end'))[:20]}), the manifest lists it for [{entry['start']}, {entry['end']}); "
                        f"the cache is damaged: {DELETE}")
    h, n_layers = manifest["hidden_size"], len(manifest["layers"])
    quantized = manifest["dtype"] in ("int8", "float8_e4m3fn")
    for row in range(entry["start"], entry["end"]):
        ids = header.get(f"{row}/input_ids")
        want = {f"{row}/input_ids": "I32", f"{row}/loss_mask": "U8"}
        s = ids["shape"][0] if isinstance(ids, dict) and len(ids.get("shape", [])) == 1 else None
        shapes = {f"{row}/input_ids": [s], f"{row}/loss_mask": [s]}
        for name in manifest["features"]:
            blocks = n_layers if name == "aux_hidden_states" else 1
            want[f"{row}/{name}"], shapes[f"{row}/{name}"] = STORED[manifest["dtype"]], [s, blocks * h]
            if quantized:
                want[f"{row}/{name}.scale"], shapes[f"{row}/{name}.scale"] = "F32", [s, blocks]
        if manifest.get("label_topk") is not None:  # version 3: the top-K logits, [s, K] int32 ids and float16 gaps
            for name, dtype in zip(TOPK_FEATURES, ("I32", "F16")):
                want[f"{row}/{name}"], shapes[f"{row}/{name}"] = dtype, [s, manifest["label_topk"]]
        for name, dtype in want.items():
            got = header.get(name)
            if s is None or not isinstance(got, dict) or got.get("dtype") != dtype or got.get("shape") != shapes[name]:
                raise UserError(f"feature cache shard {path}: tensor {name!r} is missing or not {dtype} of shape "
                                f"{shapes[name]}; the cache is damaged: {DELETE}")


# --------------------------------------------------------------------------- locks


@contextlib.contextmanager
def lock(root: Path, name: str, wait: bool = True):
    """flock on root/.locks/NAME.lock; yields True when held, False when another builder holds it (wait=False)."""
    locks = Path(root) / LOCKS
    try:
        locks.mkdir(exist_ok=True)
    except FileExistsError:
        pass
    st = os.lstat(locks)
    if not stat.S_ISDIR(st.st_mode):
        raise UserError(f"feature cache {root}: {LOCKS} is {file_kind(st.st_mode) if not stat.S_ISLNK(st.st_mode) else 'a link'}, "
                        f"not the cache's lock directory; remove it and rerun")
    fd = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UserError(f"feature cache {root}: {LOCKS}/{name}.lock is not a regular file; remove it and rerun")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                yield False
                return
            raise
        yield True
    finally:
        os.close(fd)  # closing drops the lock
