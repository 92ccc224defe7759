"""Load a big target straight into FSDP2 shards: no rank ever holds the full decoder weights.

    target = load_target_sharded(ctx, cfg.target)   # train.target_sharding: fsdp2 does this

1. build the model on the meta device (shapes only, no memory);
2. fully_shard every decoder layer (each its own FSDP2 unit), as parallel.shard_target does;
3. to_empty: allocate only this rank's shard of every layer parameter (and the replicated
   embedding, final norm and lm_head, which the drafter uses outside the target's forward);
4. read each parameter's rows for this rank from the safetensors files (byte-range reads, no
   mmap: the rest of the file never enters this process), recreate the rotary buffers, re-tie tied embeddings;
5. the fingerprint is computed from the files with the same formula as Target.fingerprint.
Peak memory per rank falls with world size (tests/distributed/test_meta_load.py measures it).
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import torch

from draftsmith.core.errors import UserError
from draftsmith.targets import load as target_mod


def weight_files(path: Path) -> list[Path]:
    """The safetensors files of a local model directory (single file or sharded with an index)."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        return sorted({path / f for f in json.loads(index.read_text())["weight_map"].values()})
    single = path / "model.safetensors"
    if single.exists():
        return [single]
    raise FileNotFoundError(f"{path}: no model.safetensors(.index.json); train.target_sharding=fsdp2 loads "
                            "safetensors weights only (re-save the target with save_pretrained, or use replicate)")


ST_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}


class _Weights:
    """Tensors of safetensors files read by byte range with plain file reads: no mmap, so only the
    rows a rank asks for ever enter its memory (the safetensors layout: 8-byte header length, JSON
    header {name: {dtype, shape, data_offsets}}, then the data)."""

    def __init__(self, files: list[Path]):
        self.where: dict[str, tuple[Path, int, dict]] = {}
        for f in files:
            with open(f, "rb") as fh:
                n = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(n))
            for name, info in header.items():
                if name != "__metadata__":
                    self.where[name] = (f, 8 + n, info)

    def has(self, name: str) -> bool:
        return name in self.where

    def shape(self, name: str) -> list[int]:
        return list(self.where[name][2]["shape"])

    def rows(self, name: str, start: int = 0, end: int | None = None) -> torch.Tensor:
        """Rows [start, end) of tensor `name` (all of a 0-d or 1-d tensor's elements likewise)."""
        path, base, info = self.where[name]
        dtype, shape = ST_DTYPES[info["dtype"]], list(info["shape"])
        if not shape:
            shape = [1]
        end = shape[0] if end is None else end
        row = math.prod(shape[1:]) * torch.empty(0, dtype=dtype).element_size()
        buf = bytearray((end - start) * row)
        with open(path, "rb") as fh:
            fh.seek(base + info["data_offsets"][0] + start * row)
            fh.readinto(buf)
        return torch.frombuffer(buf, dtype=dtype).view(end - start, *shape[1:]) if buf else torch.empty(0, dtype=dtype)


def _source_name(name: str, weights: _Weights, tied: bool) -> str:
    if weights.has(name):
        return name
    if tied and name.endswith("lm_head.weight"):
        for alt in ("model.embed_tokens.weight", "embed_tokens.weight"):
            if weights.has(alt):
                return alt
    raise KeyError(f"parameter {name} is not in the target's safetensors files; the files do not match its config")


def fingerprint(model, weights: _Weights, config) -> str:
    """Target.fingerprint's value, computed from the files (the model may be on the meta device)."""
    tied = bool(getattr(config, "tie_word_embeddings", False))
    h = hashlib.sha256()
    fields = config.to_dict()
    fields.pop("_name_or_path", None)  # as Target.fingerprint: a copy of the model elsewhere matches
    h.update(json.dumps(fields, sort_keys=True, default=str).encode())
    for name, p in model.state_dict().items():
        h.update(f"{name}:{tuple(p.shape)}".encode())
        source = _source_name(name, weights, tied)
        shape = weights.shape(source)
        row = math.prod(shape[1:]) if len(shape) > 1 else 1
        step = max(1, target_mod.HASH_CHUNK // max(row, 1))  # rows per read: about HASH_CHUNK values
        for start in range(0, shape[0] if shape else 1, step):  # every value, a block of rows at a time
            target_mod.hash_values(h, weights.rows(source, start, min(start + step, shape[0] if shape else 1))
                                   .to(p.dtype).reshape(-1))
    return h.hexdigest()[:16]


def _load_local(model, weights: _Weights, tied: bool) -> None:
    """Copy this rank's part of every parameter from the files (DTensor shards or whole tensors)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    with torch.no_grad():
        for name, param in model.named_parameters():
            if tied and name.endswith("lm_head.weight"):
                continue  # re-tied below
            source = _source_name(name, weights, tied)
            if isinstance(param, DTensor):
                local = param.to_local()
                shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
                if local.numel() == 0:
                    continue
                if any(o != 0 for o in offset[1:]) or list(shape[1:]) != list(param.shape[1:]):
                    raise UserError(f"{name}: only row (dim-0) shards can be read from files, got {param.placements}")
                local.copy_(weights.rows(source, offset[0], offset[0] + shape[0]).view(local.shape))  # this rank's rows
            else:
                param.copy_(weights.rows(source).view(param.shape))


def load_target_sharded(ctx, tcfg) -> target_mod.Target:
    """A frozen Target whose decoder layers are FSDP2 shards loaded from the meta device."""
    from torch.distributed.fsdp import fully_shard
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    if target_mod.locate(tcfg.path, tcfg.gguf_file)[1]:
        raise UserError(f"target.path {tcfg.path!r}: train.target_sharding=fsdp2 reads safetensors shards, not a GGUF "
                         "file; use train.target_sharding=replicate for a GGUF target")
    path = Path(target_mod.resolve_path(tcfg.path))
    if not path.is_dir():
        raise UserError(f"target.path {tcfg.path!r}: train.target_sharding=fsdp2 loads from a local directory; "
                         "download the model first (huggingface-cli download ... --local-dir DIR) and point to it")
    config = AutoConfig.from_pretrained(path, revision=tcfg.revision, trust_remote_code=tcfg.trust_remote_code)
    with torch.device("meta"):  # 1.
        model = AutoModelForCausalLM.from_config(config, dtype=target_mod.DTYPES[tcfg.dtype],
                                                 trust_remote_code=tcfg.trust_remote_code)
    weights = _Weights(weight_files(path))
    tied = bool(getattr(config, "tie_word_embeddings", False))
    print_fp = fingerprint(model, weights, model.config)  # 5.
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise UserError(f"target {tcfg.path}: no model.layers to shard; use train.target_sharding=replicate")
    for layer in layers:  # 2.
        fully_shard(layer)
    model.to_empty(device=ctx.device)  # 3.
    _load_local(model, weights, tied)  # 4.
    for _name, module in list(model.named_modules()):
        if hasattr(module, "inv_freq"):  # non-persistent rotary buffers: rebuild them from the config
            with torch.device(ctx.device):
                fresh = type(module)(config=module.config)
            for buf, value in fresh.named_buffers(recurse=False):
                setattr(module, buf, value)
    if tied:
        model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(path, revision=tcfg.revision, trust_remote_code=tcfg.trust_remote_code)
    target = target_mod.Target(model, tokenizer, name=target_mod.display_name(tcfg.path), path=tcfg.path)
    target._fingerprint = print_fp
    return target
