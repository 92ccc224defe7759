"""Checkpoint I/O: write a checkpoint directory atomically, read it back, rebuild its drafter.

Training (train/checkpoint.py: rotation, resume state, RNG), eval and export all use this
module; it imports nothing from train/, so eval and export never load the training code.

A checkpoint is a directory `step_0000100/` (or `final/`) under the run's output_dir:
  drafter.safetensors   the drafter's weights and buffers (never the frozen target's tensors)
  drafter.json          kind, drafter options, feature layers, the target's identity, step
  config.yaml           the fully resolved recipe
  trainer_state.pt      optimizer, scheduler, step, data position, RNG states (for resume; train/checkpoint.py)
It is built in a temporary sibling directory and moved into place with one rename, so a crash
mid-write leaves the previous checkpoint untouched and usable.

Files received from others never run code: trainer_state.pt is read with torch.load(weights_only=True)
(RNG states are stored as tensors), weights are safetensors, config.yaml is read with yaml.safe_load within bounds (safe_yaml.py),
and a checkpoint's own `target.trust_remote_code` is never honoured (load_drafter's caller decides).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from draftsmith import __version__
from draftsmith import config as config_mod
from draftsmith.core.errors import UserError
from draftsmith.core.files import (
    MAX_YAML_BYTES,
    load_safetensors,
    read_json_object,
    read_received_text,
    write_dir_atomically,
)
from draftsmith.core.safe_yaml import load as load_yaml


@dataclass
class LoadedDrafter:
    drafter: Any  # heads.base.Drafter
    target: Any  # target.Target
    config: Any  # config.RecipeConfig
    meta: dict


def drafter_meta(drafter, target, step: int) -> dict:
    return {
        "kind": drafter.kind,
        "options": config_mod.options_mapping(drafter.cfg),
        "feature_layers": drafter.feature_layers(),
        "target": target.identity(),
        "step": step,
        "written_at_ns": time.time_ns(),  # rotation and resume=true order checkpoints by write time
        "draftsmith_version": __version__,
    }


def save(path: Path, drafter, target, cfg, step: int, trainer_state: dict | None = None,
         weights: dict | None = None, tmp: Path | None = None) -> Path:
    """Write one checkpoint directory atomically (weights: a full state dict gathered by the caller)."""
    if weights is None:
        weights = {k: v.detach().contiguous().cpu() for k, v in drafter.state_dict().items()}

    def fill(tmp: Path) -> None:
        save_file(weights, str(tmp / "drafter.safetensors"))
        (tmp / "drafter.json").write_text(json.dumps(drafter_meta(drafter, target, step), indent=2))
        (tmp / "config.yaml").write_text(config_mod.to_yaml(cfg))
        if trainer_state is not None:
            torch.save(trainer_state, tmp / "trainer_state.pt")

    return write_dir_atomically(Path(path), fill, "checkpoint", tmp=tmp, marker="COMPLETE")


def read_weights(path: Path) -> dict:
    """The full drafter state dict stored in a checkpoint directory (header checked before loading)."""
    file = Path(path) / "drafter.safetensors"
    if not file.exists():
        raise FileNotFoundError(f"no drafter weights at {file}: give a checkpoint directory (step_N/ or final/)")
    return load_safetensors(file)


def fit_state(state: dict, drafter, source: str) -> None:
    """Load `state` into `drafter` (non-strict on names, strict on shapes); one line naming `source`
    when a name is missing or unexpected or a shape differs (fc, heads, ... of another size)."""
    own = drafter.state_dict()
    wrong = [f"{k} {list(v.shape)} (this drafter: {list(own[k].shape)})" for k, v in state.items()
             if k in own and tuple(v.shape) != tuple(own[k].shape)]
    if wrong:
        shown = "; ".join(wrong[:4]) + (f"; and {len(wrong) - 4} more" if len(wrong) > 4 else "")
        raise UserError(f"{source} does not fit this drafter: shape mismatch in {shown}; the weights were trained "
                         "with other drafter options or for another target")
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise UserError(f"{source} does not fit this drafter: missing {sorted(missing)}, unexpected {sorted(unexpected)}")


def load_weights(path: Path, drafter) -> None:
    """Load drafter weights from a checkpoint into an already built drafter (warm start)."""
    file = Path(path) / "drafter.safetensors"
    fit_state(read_weights(path), drafter, str(file))


def check_vocab_map(state: dict, target_vocab: int, source: str) -> None:
    """A reduced draft vocabulary read from a file: every target id draft_id + d2t[draft_id] lies in
    0..V-1 and the ids ascend (d2t >= 0 and non-decreasing, as data/draft_vocab.build writes it), and
    t2d marks exactly those ids. Out of range would be an IndexError (a device assert on a GPU); a
    negative entry would silently shift the vocabulary."""
    from draftsmith.data import draft_vocab

    d2t, t2d = state.get("d2t"), state.get("t2d")
    if d2t is None:
        return
    if d2t.dim() != 1 or d2t.is_floating_point() or d2t.dtype == torch.bool:
        raise UserError(f"{source}: d2t must be a 1-D integer tensor, got {d2t.dtype} of shape {list(d2t.shape)}")
    d2t = d2t.long()
    ids = d2t + torch.arange(d2t.shape[0])
    problem = None
    if d2t.numel() and int(d2t.min()) < 0:
        problem = f"d2t[{int((d2t < 0).nonzero()[0])}] is negative"
    elif d2t.numel() and int(ids.max()) >= target_vocab:
        problem = f"draft id {int((ids >= target_vocab).nonzero()[0])} maps past the target vocabulary of {target_vocab}"
    elif d2t.numel() > 1 and bool((ids[1:] <= ids[:-1]).any()):
        problem = "the target ids it maps to do not ascend (two draft ids would share a target id)"
    if problem is None and t2d is not None:
        try:
            draft_vocab.check(d2t, t2d)
        except ValueError as exc:
            problem = str(exc)
    if problem:
        raise UserError(f"{source}: the draft vocabulary map is invalid: {problem} (target_id = draft_id + "
                         "d2t[draft_id] must lie in 0..V-1, ascending); the file is damaged or made for another target")


# Keys of a checkpoint's config.yaml that are dropped when it is read back: written by earlier versions
# (the recipe can no longer name the API key's variable; the command line does).
_RETIRED_KEYS = (("regenerate", "api_key_env"),)


def read_config(path: Path, trust_remote_code: bool = False):
    """A checkpoint's resolved recipe. Its `target.trust_remote_code` is never taken from the file:
    only the caller's explicit `trust_remote_code` (the --trust-remote-code flag) turns it on."""
    file = Path(path) / "config.yaml"
    if not file.exists():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete draftsmith checkpoint")
    text = read_received_text(file, "checkpoint's config.yaml", MAX_YAML_BYTES)  # a regular file, bounded in size
    raw = load_yaml(text, str(file)) or {}  # bounded: aliases, depth, repeated keys
    if not isinstance(raw, dict):
        raise UserError(f"{file}: not a recipe mapping; the checkpoint is damaged")
    for section, key in _RETIRED_KEYS:
        if isinstance(raw.get(section), dict):
            raw[section].pop(key, None)
    cfg = config_mod.from_dict(raw, str(file))
    cfg.target.trust_remote_code = bool(trust_remote_code)
    return cfg


def read_meta(path: Path) -> dict:
    """drafter.json, checked: a JSON object naming a registered kind and the target's fingerprint."""
    from draftsmith.heads import DRAFTERS

    file = Path(path) / "drafter.json"
    meta = read_json_object(file, "checkpoint's drafter.json")
    kind, target = meta.get("kind"), meta.get("target")
    if not isinstance(kind, str) or kind not in DRAFTERS.names():
        raise UserError(f"{file}: kind {str(kind)[:40]!r} is not a drafter kind draftsmith knows "
                        f"({', '.join(sorted(DRAFTERS.names()))}); the checkpoint is damaged or from a newer draftsmith")
    if not isinstance(target, dict) or not isinstance(target.get("fingerprint"), str):
        raise UserError(f"{file}: no target fingerprint (key target.fingerprint); the checkpoint is damaged: "
                        "without it draftsmith cannot check that the drafter runs on the target it was trained for")
    return meta


def read_speedup_profile(path: Path) -> dict | None:
    """PATH/speedup_profile.json (`draftsmith profile`), checked, or None when there is none: a regular
    UTF-8 file of at most 16 MiB holding the profile's schema, and a `recommendation` mapping workload
    names to mappings (export reads it: stops_paying_at_batch, recommended_num_speculative_tokens)."""
    from draftsmith.report.speedup_model import PROFILE_FILE

    file = Path(path) / PROFILE_FILE
    if not os.path.lexists(file):
        return None
    return check_speedup_profile(read_json_object(file, "speedup profile"), file, path)


def check_speedup_profile(data: dict, file: Path, checkpoint) -> dict:
    """A speedup profile's schema and `recommendation` (a mapping of workload to mapping), else one line
    naming `file`."""
    from draftsmith.report.speedup_model import PROFILE_SCHEMA

    fix = f"rerun `draftsmith profile {checkpoint}` or delete it"
    if data.get("schema") != PROFILE_SCHEMA:
        raise UserError(f"{file}: schema {str(data.get('schema'))[:60]!r} is not {PROFILE_SCHEMA}; {fix}")
    rec = data.get("recommendation")
    if rec is not None and (not isinstance(rec, dict) or not all(isinstance(v, dict) for v in rec.values())):
        raise UserError(f"{file}: `recommendation` must map each workload to a mapping, got "
                        f"{json.dumps(rec)[:80]}; {fix}")
    return data


def run_in_dtype(target, dtype: str) -> None:
    """Cast a loaded (fingerprint-checked) target to `dtype` in place; its recorded fingerprint stays
    the one of the weights as loaded (a bf16 copy of fp32 weights is the same model, rounded)."""
    from draftsmith.targets.load import DTYPES

    if dtype not in DTYPES:
        raise UserError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
    _ = target.fingerprint  # computed from the values as loaded, before rounding
    if target.dtype != DTYPES[dtype]:
        target.model.to(DTYPES[dtype])


def load_drafter(path: str | Path, device: str | None = None, target=None,
                 trust_remote_code: bool = False, dtype: str | None = None, check_profile: bool = True) -> LoadedDrafter:
    """Rebuild a trained drafter (and its target, unless given) from a checkpoint directory.

    The target's custom code runs only with trust_remote_code=True given here (a received
    checkpoint's config.yaml cannot turn it on). dtype: run the target in this dtype instead of the
    recipe's target.dtype (`eval --dtype`): it is loaded as trained, its fingerprint checked, then cast.
    check_profile: refuse a damaged speedup_profile.json (export copies it; `profile`, which rewrites it, passes False)."""
    from draftsmith.heads import DRAFTERS
    from draftsmith.targets import load as target_mod

    path = Path(path)
    if not (path / "drafter.json").exists():
        raise FileNotFoundError(f"{path} is not a draftsmith checkpoint (no drafter.json); expected e.g. runs/NAME/final")
    meta = read_meta(path)
    cfg = read_config(path, trust_remote_code)
    if check_profile:
        read_speedup_profile(path)
    if meta["kind"] != cfg.drafter.kind:
        raise UserError(f"{path}: drafter.json names kind {meta['kind']!r} but config.yaml trains "
                        f"drafter.kind {cfg.drafter.kind!r}; the checkpoint is damaged (its two files disagree)")
    state = read_weights(path)  # header checked before anything is built
    if target is None:
        target_cfg = cfg.target
        if device is not None:
            target_cfg.device = device
        try:
            target = target_mod.from_config(target_cfg)  # in the recipe's dtype: the fingerprint is of those values
        except FileNotFoundError as exc:  # name where the path came from: the checkpoint's recipe
            raise FileNotFoundError(f"{path / 'config.yaml'}: target.path {target_cfg.path!r}: {exc}; "
                                    "or give the target with --target") from None
    expected = meta["target"]["fingerprint"]
    if not target.matches(expected):
        raise UserError(
            f"{path} was trained for target {meta['target'].get('name')} (fingerprint {expected}), "
            f"but the loaded target {target.name} has fingerprint {target.fingerprint}; load the same target"
        )
    if dtype is not None:
        run_in_dtype(target, dtype)
    check_vocab_map(state, target.vocab_size, str(path / "drafter.safetensors"))
    drafter = DRAFTERS.get(meta["kind"]).from_target(cfg.drafter.options, target, None)
    fit_state(state, drafter, f"{path / 'drafter.safetensors'} (the drafter built from config.yaml's drafter.options)")
    return LoadedDrafter(drafter=drafter.eval(), target=target, config=cfg, meta=meta)
