"""Sizes a target's files declare, checked against the tensors the files really hold, before any model
is built: a config.json or GGUF declaring 100,000 layers with 4 real ones made `inspect` and `eval`
build 100,000 layers (minutes) before failing. A GGUF file's header is walked with a bound on every
count and length (targets/gguf_header.py: keys, header bytes, arrays, alignment, each tensor's bytes
inside the file), then its metadata is checked: an architecture transformers reads, the counts that
size the model whole numbers >= 1 (head_count 0 was a ZeroDivisionError), finite floats (a NaN
rope.freq_base), tokens present and unique, merges or scores present, EOS inside the vocabulary.

    check_gguf("models/x.gguf")          # raises UserError naming the file
    check_checkpoint_layers("models/x")  # config.json's num_hidden_layers against model*.safetensors
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from draftsmith.core.errors import UserError
from draftsmith.targets import gguf_header
from draftsmith.targets.gguf_header import bad as _bad

_LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks|blk)\.(\d+)\.")
# {arch}.KEY values that size the model: whole numbers >= 1 when present (head_count 0 divided by zero)
# (expert_count is left out: a dense model may carry 0 there)
_COUNTS = ("context_length", "embedding_length", "feed_forward_length", "attention.head_count",
           "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.dimension_count",
           "vocab_size")
_MAX_COUNT = 1 << 31


def check_gguf(path: str | Path) -> dict:
    """The checks of the module docstring for one GGUF file; returns its metadata."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    path = Path(path)
    header = gguf_header.read(path)
    meta, names = header.meta, [t.name for t in header.tensors]
    arch = meta.get("general.architecture")
    if not isinstance(arch, str) or arch not in GGUF_SUPPORTED_ARCHITECTURES or arch in ("general", "tokenizer"):
        raise _bad(path, f"general.architecture {str(arch)[:40]!r} is not one transformers reads from GGUF "
                         f"({', '.join(a for a in GGUF_SUPPORTED_ARCHITECTURES if a not in ('general', 'tokenizer'))})")
    _check_model_values(path, arch, meta)
    _check_embedding(path, arch, meta, header.tensors)
    _check_tokens(path, meta)
    _check_layers(path, f"{arch}.block_count", meta.get(f"{arch}.block_count", _MISSING), names)
    return meta


def _check_model_values(path: Path, arch: str, meta: dict) -> None:
    """Counts that size the model are whole numbers >= 1, attention heads split into KV groups, and every
    float outside the tokenizer is finite (a NaN rope.freq_base made every logit NaN, so both sides of
    eval's lossless check emitted the same token)."""
    for name in _COUNTS:
        key = f"{arch}.{name}"
        value = meta.get(key)
        if value is None or isinstance(value, (list, gguf_header.LongArray)):  # absent, or one value per layer
            continue
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value < _MAX_COUNT:
            raise _bad(path, f"{key} is {_show(value)}, not a whole number in 1..{_MAX_COUNT - 1}")
    heads, kv = meta.get(f"{arch}.attention.head_count"), meta.get(f"{arch}.attention.head_count_kv")
    if isinstance(heads, int) and isinstance(kv, int) and heads % kv:
        raise _bad(path, f"{arch}.attention.head_count {heads} is not a multiple of head_count_kv {kv}")
    for key, value in meta.items():
        if isinstance(value, float) and not key.startswith("tokenizer.") and not math.isfinite(value):
            raise _bad(path, f"{key} is {value}, not a finite number")
    base = meta.get(f"{arch}.rope.freq_base")
    if isinstance(base, float) and base <= 0:
        raise _bad(path, f"{arch}.rope.freq_base is {base}; a rope base must be positive")


def _check_embedding(path: Path, arch: str, meta: dict, tensors) -> None:
    """token_embd.weight (ne[0] = width, ne[1] = vocabulary rows) against embedding_length and vocab_size, so
    that `inspect`, which builds no weights, does not report a vocabulary the file does not hold."""
    embd = next((t for t in tensors if t.name == "token_embd.weight" and len(t.dims) == 2), None)
    if embd is None:
        return
    for key, held in ((f"{arch}.embedding_length", embd.dims[0]), (f"{arch}.vocab_size", embd.dims[1])):
        value = meta.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value != held:
            raise _bad(path, f"{key} is {value} but its tensor token_embd.weight holds {held}")


def _check_tokens(path: Path, meta: dict) -> None:
    tokens = meta.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens:
        raise _bad(path, "tokenizer.ggml.tokens is missing or empty (the file carries no tokenizer)")
    if not isinstance(meta.get("tokenizer.ggml.merges"), list) and not isinstance(meta.get("tokenizer.ggml.scores"), list):
        raise _bad(path, "its tokenizer has neither tokenizer.ggml.merges nor tokenizer.ggml.scores")
    if len(set(tokens)) != len(tokens):  # a vocabulary maps each token to one id (the BPE model failed to build)
        first = {}
        for i, token in enumerate(tokens):
            if token in first:
                raise _bad(path, f"tokenizer.ggml.tokens holds {_show(token)} twice (ids {first[token]} and {i})")
            first[token] = i
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.padding_token_id"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, int) and 0 <= value < len(tokens)):
            raise _bad(path, f"{key} {_show(value)} lies outside its {len(tokens):,} tokens")


_MISSING = object()


def _show(value) -> str:
    """A metadata value in a message: its type when it is not a number, quoted and cut to 40 characters."""
    if isinstance(value, str):
        return f"the string {value[:40]!r}"
    return repr(value)[:40]


def _check_layers(path: Path, key: str, declared, names) -> None:
    real = {int(m.group(1)) for n in names if (m := _LAYER.search(n))}
    if not real:
        return  # no per-layer tensors to compare with (a config-only directory)
    held = f"its tensors hold {max(real) + 1} (layers {min(real)}..{max(real)})"
    fix = "the file is damaged: restore it from the model's source"
    if declared is _MISSING:
        raise UserError(f"{path}: has no {key} (the number of layers), while {held}; {fix}")
    if isinstance(declared, bool) or not isinstance(declared, int):
        raise UserError(f"{path}: {key} is {_show(declared)}, not a whole number of layers ({held}); {fix}")
    # more tensors than declared layers is allowed (an MTP layer, a vision tower); declared layers without
    # tensors are what made transformers build 100,000 layers
    if not 1 <= declared <= max(real) + 1:
        raise UserError(f"{path}: {key} declares {declared} layers but {held}; {fix}")


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
    key = next((k for k in ("num_hidden_layers", "n_layer", "num_layers") if k in text), "num_hidden_layers")
    declared = text.get(key, _MISSING)
    if declared is _MISSING and isinstance(text.get("layers_block_type"), list):  # Nemotron-H saves its layer list only
        key, declared = "layers_block_type (its length)", len(text["layers_block_type"])
    _check_layers(config_file, key, declared, names)
