"""A GGUF file's header, read with a bound on every count and length before transformers' reader sees it.

A received GGUF is data: its header is walked once, in time linear in its bytes, and every count and
offset is checked against the file (one line naming the file, never a struct.error, a ZeroDivisionError,
a numpy reshape error or a minute of work):

  keys          at most MAX_KEYS (a real model has 20-60; transformers' reader is quadratic in them:
                50,000 keys took 50-90 s)
  header bytes  at most MAX_HEADER_BYTES for the keys and tensor infos (a 262,144-token vocabulary
                with its scores and types is about 6 MiB)
  arrays        at most MAX_ARRAY_ENTRIES entries (the largest vocabularies hold 262,144 tokens)
  alignment     general.alignment a uint32 power of two (0 or 3 broke transformers' reader)
  tensors       unique names, a known ggml type, at most 8 dimensions, the first a multiple of the type's
                block, data aligned and inside the file (a truncated file, an offset or a shape past
                the end was a reshape traceback)

    header = read("models/x.gguf")   # GGUFHeader(meta, tensors, data_start, size); raises UserError
"""
from __future__ import annotations

import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import UserError

MAX_KEYS = 4096
MAX_HEADER_BYTES = 64 << 20
MAX_ARRAY_ENTRIES = 1 << 20
MAX_DIMS = 8  # GGML_MAX_DIMS is 4; a few more cost nothing
DEFAULT_ALIGNMENT = 32

# GGUF value types: struct format of the scalars; 8 string, 9 array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
KEEP_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores")


@dataclass(frozen=True)
class LongArray:
    """An array of more than 16 entries that draftsmith does not keep (a per-layer value, token types)."""
    count: int


@dataclass
class Tensor:
    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass
class GGUFHeader:
    meta: dict  # key -> value (an array of more than 16 entries not in KEEP_ARRAYS: a LongArray)
    tensors: list[Tensor]
    data_start: int  # where the tensor data begins (the header's end, aligned)
    size: int  # the file's size


def bad(path: Path, why: str) -> UserError:
    return UserError(f"{path}: {why}; the GGUF file is damaged or not a GGUF model: download or convert it again")


class _Reader:
    """A cursor over the header bytes: every read is checked against the bytes present."""

    def __init__(self, data: bytes, path: Path, size: int):
        self.data, self.pos, self.path, self.size = data, 0, path, size

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            if self.pos + n <= self.size:
                raise bad(self.path, f"its header runs past {MAX_HEADER_BYTES >> 20} MiB (at offset {self.pos:,}), "
                                     "more than any model's keys and tensor list need")
            raise bad(self.path, f"its header needs {n:,} more bytes at offset {self.pos:,}, past the end of the file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, kind: int):
        fmt = SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str):
        if kind in SCALARS:
            return self.scalar(kind)
        if kind == 8:
            return self.string()
        if kind != 9:
            raise bad(self.path, f"key {key[:80]!r} has unknown value type {kind}")
        inner, count = self.scalar(4), self.scalar(10)
        if inner == 9 or (inner not in SCALARS and inner != 8):
            raise bad(self.path, f"key {key[:80]!r} is an array of value type {inner}, which GGUF does not define")
        smallest = 8 if inner == 8 else struct.calcsize(SCALARS[inner])
        if count * smallest > self.size - self.pos:  # past the read window only: take() says so
            raise bad(self.path, f"key {key[:80]!r} claims {count:,} entries, more than the file holds")
        if count > MAX_ARRAY_ENTRIES:
            raise bad(self.path, f"key {key[:80]!r} claims {count:,} entries, more than the {MAX_ARRAY_ENTRIES:,} "
                                 "draftsmith reads (the largest vocabularies hold 262,144 tokens)")
        keep = key in KEEP_ARRAYS or count <= 16
        if inner != 8:  # fixed-size entries: one slice, unpacked only when kept
            raw = self.take(count * smallest)
            return list(struct.unpack(f"<{count}{SCALARS[inner][1]}", raw)) if keep else LongArray(count)
        items = [self.string() for _ in range(count)]
        return items if keep else LongArray(count)


def _open_regular(path: Path):
    """The file opened for reading, refused in one line when it is not a regular file (a FIFO would hang)."""
    from draftsmith.core.files import file_kind

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise UserError(f"{path}: is {file_kind(st.st_mode)}, not a regular file; give the path of a .gguf file")
    return os.fdopen(fd, "rb"), st.st_size


def read(path: str | Path) -> GGUFHeader:
    """The header of a GGUF file, every count and offset checked (module docstring)."""
    path = Path(path)
    f, size = _open_regular(path)
    with f:
        data = f.read(MAX_HEADER_BYTES)
    r = _Reader(data, path, size)
    if r.take(4) != b"GGUF":
        raise bad(path, "it does not start with the GGUF magic bytes")
    version, n_tensors, n_kv = r.scalar(4), r.scalar(10), r.scalar(10)
    if version not in (2, 3) or n_kv > len(data) // 12 or n_tensors > len(data) // 24:
        raise bad(path, f"version {version} with {n_kv:,} keys and {n_tensors:,} tensors does not fit its {len(data):,} bytes")
    if n_kv > MAX_KEYS:
        raise bad(path, f"it declares {n_kv:,} metadata keys, more than the {MAX_KEYS:,} draftsmith reads "
                        "(a model has a few dozen)")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        kind = r.scalar(4)
        if key == "general.alignment" and kind != 4:
            raise bad(path, f"general.alignment has value type {kind}, not uint32")
        meta[key] = r.value(kind, key)
    tensors = []
    for _ in range(n_tensors):
        name = r.string()
        dims = r.scalar(4)
        if dims > MAX_DIMS:
            raise bad(path, f"tensor {name[:80]!r} claims {dims} dimensions")
        shape = struct.unpack(f"<{dims}Q", r.take(8 * dims))
        tensors.append(Tensor(name, shape, r.scalar(4), r.scalar(10)))
    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if alignment == 0 or alignment & (alignment - 1):
        raise bad(path, f"general.alignment {alignment} is not a power of two (GGUF aligns tensor data to one; "
                        f"the default is {DEFAULT_ALIGNMENT})")
    data_start = -(-r.pos // alignment) * alignment
    header = GGUFHeader(meta, tensors, data_start, size)
    _check_tensors(path, header, alignment)
    return header


def _check_tensors(path: Path, header: GGUFHeader, alignment: int) -> None:
    """Each tensor's type, shape and byte range against the file (what transformers would reshape)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    seen = set()
    room = header.size - header.data_start
    for t in header.tensors:
        label = f"tensor {t.name[:80]!r}"
        if t.name in seen:
            raise bad(path, f"{label} appears twice")
        seen.add(t.name)
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
        except (ValueError, KeyError):
            raise bad(path, f"{label} has ggml type {t.ggml_type}, which the gguf package does not know") from None
        if not t.dims or t.dims[0] % block:
            raise bad(path, f"{label} has shape {list(t.dims)}, not a whole number of {block}-value blocks")
        values = 1
        for d in t.dims:
            values *= d
        nbytes = values // block * type_size
        if t.offset % alignment:
            raise bad(path, f"{label} starts at data offset {t.offset:,}, not a multiple of the alignment {alignment}")
        if t.offset + nbytes > room:
            raise bad(path, f"{label} (shape {list(t.dims)[:MAX_DIMS]}, {nbytes:,} bytes at data offset {t.offset:,}) "
                            f"ends past the file's {header.size:,} bytes (truncated, or a damaged shape or offset)")
