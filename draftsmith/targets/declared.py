"""Sizes a target's files declare, checked against the tensors the files really hold, before any model
is built: a config.json or GGUF declaring 100,000 layers with 4 real ones made `inspect` and `eval`
build 100,000 layers (minutes) before failing. A GGUF file's header is walked with a bound on every
length (a truncated file or an array claiming 2^40 entries is one line naming the file, never a
struct.error), and its tokenizer metadata is checked (tokens present, merges or scores present, EOS
inside the vocabulary, an architecture transformers reads).

    check_gguf("models/x.gguf")          # raises UserError naming the file
    check_checkpoint_layers("models/x")  # config.json's num_hidden_layers against model*.safetensors
"""
from __future__ import annotations

import re
import struct
from pathlib import Path

from draftsmith.core.errors import UserError

# GGUF value types: struct format of the scalars; 8 string, 9 array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_KEEP_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores")
_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|blk)\.(\d+)\.")


class _Reader:
    """A GGUF header cursor: every read is checked against the bytes present."""

    def __init__(self, data: bytes, path: Path):
        self.data, self.pos, self.path = data, 0, path

    def take(self, n: int) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise _bad(self.path, f"its header needs {n:,} more bytes at offset {self.pos:,}, past the end of the file")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def scalar(self, kind: int):
        fmt = _SCALARS[kind]
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def string(self) -> str:
        return self.take(self.scalar(10)).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str):
        if kind in _SCALARS:
            return self.scalar(kind)
        if kind == 8:
            return self.string()
        if kind != 9:
            raise _bad(self.path, f"key {key[:80]!r} has unknown value type {kind}")
        inner, count = self.scalar(4), self.scalar(10)
        smallest = 8 if inner == 8 else struct.calcsize(_SCALARS.get(inner, "<B"))
        if inner == 9 or count * smallest > len(self.data) - self.pos:
            raise _bad(self.path, f"key {key[:80]!r} claims {count:,} entries, more than the file holds")
        items = [self.value(inner, key) for _ in range(count)]
        return items if key in _KEEP_ARRAYS or count <= 16 else count


def _bad(path: Path, why: str) -> UserError:
    return UserError(f"{path}: {why}; the GGUF file is damaged or not a GGUF model: download or convert it again")


def read_gguf_header(path: str | Path, limit: int = 128 << 20) -> tuple[dict, list[str]]:
    """(metadata, tensor names) of a GGUF file, every length bounded by the file's size (a header, tokenizer
    included, is a few MiB; only the first `limit` bytes are read)."""
    path = Path(path)
    with open(path, "rb") as f:
        data = f.read(limit)
    r = _Reader(data, path)
    if r.take(4) != b"GGUF":
        raise _bad(path, "it does not start with the GGUF magic bytes")
    version, n_tensors, n_kv = r.scalar(4), r.scalar(10), r.scalar(10)
    if version not in (2, 3) or n_kv > len(data) // 12 or n_tensors > len(data) // 24:
        raise _bad(path, f"version {version} with {n_kv:,} keys and {n_tensors:,} tensors does not fit its {len(data):,} bytes")
    meta = {}
    for _ in range(n_kv):
        key = r.string()
        meta[key] = r.value(r.scalar(4), key)
    names = []
    for _ in range(n_tensors):
        names.append(r.string())
        dims = r.scalar(4)
        if dims > 8:
            raise _bad(path, f"tensor {names[-1][:80]!r} claims {dims} dimensions")
        r.take(8 * dims + 4 + 8)
    return meta, names


def check_gguf(path: str | Path) -> dict:
    """The checks of the module docstring for one GGUF file; returns its metadata."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = Path(path)
    meta, names = read_gguf_header(path)
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_SUPPORTED_ARCHITECTURES or arch in ("general", "tokenizer"):
        raise _bad(path, f"general.architecture {str(arch)[:40]!r} is not one transformers reads from GGUF "
                         f"({', '.join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ('general', 'tokenizer'))})")
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise _bad(path, "tokenizer.ggml.tokens is missing or empty (the file carries no tokenizer)")
    if not isinstance(meta.get("tokenizer.ggml.merges"), list) and not isinstance(meta.get("tokenizer.ggml.scores"), list):
        raise _bad(path, "its tokenizer has neither tokenizer.ggml.merges nor tokenizer.ggml.scores")
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, int) and 0 <= value < len(tokens)):
            raise _bad(path, f"{key} {value!r} lies outside its {len(tokens):,} tokens")
    declared = meta.get(f"{arch}.block_count")
    _check_layers(path, f"{arch}.block_count", declared, names)
    return meta


def _check_layers(path: Path, key: str, declared, names) -> None:
    real = {int(m.group(1)) for n in names if (m := _LAYER.search(n))}
    if not real:
        return  # no per-layer tensors to compare with (a config-only directory)
    # more tensors than declared layers is allowed (an MTP layer, a vision tower); declared layers without
    # tensors are what made transformers build 100,000 layers
    if not isinstance(declared, int) or isinstance(declared, bool) or not 1 <= declared <= max(real) + 1:
        raise UserError(f"{path}: {key} declares {str(declared)[:20]} layers but its tensors hold {max(real) + 1} "
                        f"(layers {min(real)}..{max(real)}); the file is damaged: restore it from the model's source")


def check_checkpoint_layers(local: str | Path) -> None:
    """A local HF checkpoint's config.json num_hidden_layers against the layers its *.safetensors hold
    (headers only; a directory without weight files is not checked)."""
    from draftsmith.core.files import check_safetensors, read_json_object

    local = Path(local).expanduser()
    config_file = local / "config.json"
    weights = sorted(local.glob("*.safetensors"))
    if not config_file.is_file() or not weights:
        return
    config = read_json_object(config_file, "target's config.json")
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    names = [name for w in weights for name in check_safetensors(w) if name != "__metadata__"]
    key, declared = "num_hidden_layers", text.get("num_hidden_layers")
    if declared is None and isinstance(text.get("layers_block_type"), list):  # Nemotron-H saves its layer list only
        key, declared = "layers_block_type (its length)", len(text["layers_block_type"])
    _check_layers(config_file, key, declared, names)
