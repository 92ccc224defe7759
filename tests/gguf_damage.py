"""Byte-level damage to a GGUF file, for tests and the robustness harness: the header is walked once to
find where each key's value and each tensor's dims and offset sit, then single fields are rewritten
(or keys inserted) without the `gguf` package, so the damage reaches draftsmith's own header checks.

    lay = layout(data)
    set_scalar(data, "llama.attention.head_count", "<I", 0)
    insert_keys(data, 50_000)                      # 50,000 extra uint32 keys
"""
from __future__ import annotations

import struct

_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _skip_value(data: bytes, pos: int, kind: int) -> int:
    if kind in _SIZES:
        return pos + _SIZES[kind]
    if kind == 8:
        return pos + 8 + struct.unpack_from("<Q", data, pos)[0]
    inner, count = struct.unpack_from("<IQ", data, pos)
    pos += 12
    if inner in _SIZES:
        return pos + count * _SIZES[inner]
    for _ in range(count):
        pos = _skip_value(data, pos, inner)
    return pos


def layout(data: bytes) -> dict:
    """{"keys": {key: offset of its value type}, "tensors": [(name, offset of n_dims, offset of its data
    offset)], "header_end": offset after the tensor infos} of an intact GGUF file."""
    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos, keys, tensors = 24, {}, []
    for _ in range(n_kv):
        n = struct.unpack_from("<Q", data, pos)[0]
        key = data[pos + 8:pos + 8 + n].decode()
        pos += 8 + n
        keys[key] = pos
        pos = _skip_value(data, pos + 4, struct.unpack_from("<I", data, pos)[0])
    for _ in range(n_tensors):
        n = struct.unpack_from("<Q", data, pos)[0]
        name = data[pos + 8:pos + 8 + n].decode()
        dims_at = pos + 8 + n
        dims = struct.unpack_from("<I", data, dims_at)[0]
        offset_at = dims_at + 4 + 8 * dims + 4
        tensors.append((name, dims_at, offset_at))
        pos = offset_at + 8
    return {"keys": keys, "tensors": tensors, "header_end": pos}


def set_scalar(data: bytes, key: str, fmt: str, value) -> bytes:
    """The value of scalar `key` rewritten in place (same width; fmt e.g. "<I", "<f")."""
    at = layout(data)["keys"][key] + 4
    return data[:at] + struct.pack(fmt, value) + data[at + struct.calcsize(fmt):]


def set_type_and_value(data: bytes, key: str, kind: int, raw: bytes, old_width: int) -> bytes:
    """`key`'s value type and bytes replaced (old_width: the bytes its old value took)."""
    at = layout(data)["keys"][key]
    return data[:at] + struct.pack("<I", kind) + raw + data[at + 4 + old_width:]


def _entry(key: str, kind: int, raw: bytes) -> bytes:
    return struct.pack("<Q", len(key)) + key.encode() + struct.pack("<I", kind) + raw


def insert_keys(data: bytes, count: int) -> bytes:
    """`count` extra uint32 keys right after the header, 32 bytes each (the tensor data stays aligned)."""
    body = b"".join(_entry("x.pad.%010d" % i, 4, struct.pack("<I", i)) for i in range(count))
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    return data[:16] + struct.pack("<Q", n_kv + count) + body + data[24:]


def add_key(data: bytes, key: str, kind: int, raw: bytes) -> bytes:
    """One extra key right after the header (the tensor data offsets then no longer line up unless the
    entry's size is a multiple of the alignment)."""
    n_kv = struct.unpack_from("<Q", data, 16)[0]
    return data[:16] + struct.pack("<Q", n_kv + 1) + _entry(key, kind, raw) + data[24:]


def set_tensor_offset(data: bytes, index: int, offset: int) -> bytes:
    at = layout(data)["tensors"][index][2]
    return data[:at] + struct.pack("<Q", offset) + data[at + 8:]


def set_tensor_dim(data: bytes, index: int, dim: int, value: int) -> bytes:
    at = layout(data)["tensors"][index][1] + 4 + 8 * dim
    return data[:at] + struct.pack("<Q", value) + data[at + 8:]


def duplicate_token(data: bytes) -> bytes:
    """Two tokens of tokenizer.ggml.tokens made equal (the first pair of equal length whose bytes differ)."""
    at = layout(data)["keys"]["tokenizer.ggml.tokens"] + 4
    count = struct.unpack_from("<Q", data, at + 4)[0]
    pos, seen = at + 12, {}
    for _ in range(count):
        n = struct.unpack_from("<Q", data, pos)[0]
        if n in seen and n > 0:
            first = seen[n]
            return data[:pos + 8] + data[first + 8:first + 8 + n] + data[pos + 8 + n:]
        seen[n] = pos
        pos += 8 + n
    raise ValueError("no two tokens of equal length")
