"""Checkpoints: written atomically, rotated, resumable, and loadable on their own.

A checkpoint is a directory `step_0000100/` (or `final/`) under the run's output_dir:
  drafter.safetensors   the drafter's weights and buffers (never the frozen target's tensors)
  drafter.json          kind, drafter options, feature layers, the target's identity, step
  config.yaml           the fully resolved recipe
  trainer_state.pt      optimizer, scheduler, step, data position, RNG states (for resume)
It is built in a temporary sibling directory and moved into place with one rename, so a crash
mid-write leaves the previous checkpoint untouched and usable.

Files received from others never run code: trainer_state.pt is read with torch.load(weights_only=True)
(RNG states are stored as tensors), weights are safetensors, config.yaml is read with yaml.safe_load,
and a checkpoint's own `target.trust_remote_code` is never honoured (load_drafter's caller decides).
"""
from __future__ import annotations

import json
import os
import pickle
import random
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from safetensors.torch import load_file, save_file

from draftsmith import __version__
from draftsmith import config as config_mod

STEP_PREFIX = "step_"


@dataclass
class LoadedDrafter:
    drafter: Any  # heads.base.Drafter
    target: Any  # target.Target
    config: Any  # config.RecipeConfig
    meta: dict


def rng_state() -> dict:
    """Every RNG state as tensors and plain numbers, so torch.load(weights_only=True) reads it back."""
    version, words, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state = {"torch": torch.get_rng_state(),
             "python": {"version": version, "state": torch.tensor(words, dtype=torch.int64), "gauss": gauss},
             "numpy": {"kind": kind, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                       "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def write_dir_atomically(final_dir: Path, fill, tmp: Path | None = None, marker: str | None = "COMPLETE") -> Path:
    """Call fill(tmp_dir) to write files, then move tmp_dir to final_dir in one rename; if fill
    raises, nothing reaches final_dir. Checkpoints get a `marker` file; exports pass None.

    `tmp` may name a directory other ranks already wrote into (see save_collective)."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    if tmp is None:
        tmp = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-", dir=final_dir.parent))
    try:
        fill(tmp)
        if marker:
            (tmp / marker).write_text("ok\n")
        if final_dir.exists():
            old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}")
            os.replace(final_dir, old)
            os.replace(tmp, final_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final_dir)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final_dir


def drafter_meta(drafter, target, step: int) -> dict:
    import dataclasses

    return {
        "kind": drafter.kind,
        "options": dataclasses.asdict(drafter.cfg),
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

    return write_dir_atomically(Path(path), fill, tmp)


def save_collective(ctx, path: Path, drafter, target, cfg, step: int, trainer_state: dict, weights: dict) -> Path:
    """Every rank calls this. Backends with sharded engine state (DeepSpeed) write their shards into a
    shared temporary directory first; rank 0 then adds the drafter files and renames it into place
    (multi-node runs need output_dir on a filesystem every node sees)."""
    path = Path(path)
    if not ctx.distributed:
        return save(path, drafter, target, cfg, step, trainer_state, weights)
    tmp = path.with_name(f".{path.name}.tmp-step{step}")
    if ctx.is_main:
        shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a crashed write
        tmp.mkdir(parents=True)
    ctx.barrier()
    ctx.save_engine_state(tmp)
    ctx.barrier()
    if ctx.is_main:
        save(path, drafter, target, cfg, step, trainer_state, weights, tmp)
    ctx.barrier()
    return path


def _write_order(path: Path) -> tuple[int, int]:
    """(write time in ns, step): the time recorded in drafter.json, else the COMPLETE marker's mtime."""
    step = int(path.name[len(STEP_PREFIX):]) if path.name[len(STEP_PREFIX):].isdigit() else -1
    try:
        written = int(json.loads((path / "drafter.json").read_text())["written_at_ns"])
    except (OSError, ValueError, KeyError, TypeError):
        written = (path / "COMPLETE").stat().st_mtime_ns
    return written, step


def step_dirs(output_dir: Path) -> list[Path]:
    """Complete step checkpoints, oldest WRITTEN first (not by step number: a run resumed from an
    earlier step writes newer checkpoints with lower numbers, and those are the ones to keep)."""
    output_dir = Path(output_dir)
    if not output_dir.exists():
        return []
    found = [p for p in output_dir.iterdir() if p.name.startswith(STEP_PREFIX) and (p / "COMPLETE").exists()]
    return sorted(found, key=_write_order)


def latest(output_dir: Path) -> Path | None:
    dirs = step_dirs(output_dir)
    return dirs[-1] if dirs else None


def rotate(output_dir: Path, keep_last: int) -> None:
    """Delete all but the newest keep_last step checkpoints (keep_last <= 0 keeps all)."""
    if keep_last <= 0:
        return
    for old in step_dirs(output_dir)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)


def clean_stale_tmp(output_dir: Path) -> list[str]:
    """Remove the temporary folders of interrupted checkpoint writes (`.step_N.tmp-*`, `.final.tmp-*`,
    `.NAME.old-*`); call once at the start of a run, before any checkpoint is written."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    removed = []
    for p in output_dir.iterdir():
        if p.is_dir() and p.name.startswith(".") and (".tmp-" in p.name or ".old-" in p.name):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return sorted(removed)


# What a run writes into its output_dir; `train --overwrite` removes exactly these.
RUN_FILES = ("final", "metrics.jsonl", "tensorboard")


def previous_run(output_dir: Path) -> list[str]:
    """Names in output_dir that a previous training run wrote (checkpoints, metrics)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    return sorted(p.name for p in output_dir.iterdir() if p.name in RUN_FILES or p.name.startswith(STEP_PREFIX))


def clear_previous_run(output_dir: Path) -> list[str]:
    """Delete a previous run's checkpoints and logs from output_dir (other files stay)."""
    names = previous_run(output_dir)
    for name in names:
        p = Path(output_dir) / name
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    return names


def load_trainer_state(path: Path) -> dict:
    """Read trainer_state.pt without running code: tensors and plain data only (weights_only=True)."""
    file = Path(path) / "trainer_state.pt"
    if not file.exists():
        raise FileNotFoundError(f"{file} is missing: {path} holds drafter weights only; use train.init_from for a warm start")
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(
            f"{file} holds objects other than tensors and plain data, which could run code when loaded "
            f"({first}); refused. Resume only from checkpoints written by this draftsmith, or warm start "
            "from the weights alone with train.init_from (safetensors)") from None


def read_weights(path: Path) -> dict:
    """The full drafter state dict stored in a checkpoint directory."""
    file = Path(path) / "drafter.safetensors"
    if not file.exists():
        raise FileNotFoundError(f"no drafter weights at {file}: give a checkpoint directory (step_N/ or final/)")
    return load_file(str(file))


def load_weights(path: Path, drafter) -> None:
    """Load drafter weights from a checkpoint into an already built drafter (warm start)."""
    file = Path(path) / "drafter.safetensors"
    state = read_weights(path)
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{file} does not fit this drafter: missing {sorted(missing)}, unexpected {sorted(unexpected)}")


# Keys of a checkpoint's config.yaml that are dropped when it is read back: written by earlier versions
# (the recipe can no longer name the API key's variable; the command line does).
_RETIRED_KEYS = (("regenerate", "api_key_env"),)


def read_config(path: Path, trust_remote_code: bool = False):
    """A checkpoint's resolved recipe. Its `target.trust_remote_code` is never taken from the file:
    only the caller's explicit `trust_remote_code` (the --trust-remote-code flag) turns it on."""
    file = Path(path) / "config.yaml"
    if not file.exists():
        raise FileNotFoundError(f"{file} is missing: {path} is not a complete draftsmith checkpoint")
    raw = yaml.safe_load(file.read_text()) or {}
    if not isinstance(raw, dict):
        raise ValueError(f"{file}: not a recipe mapping; the checkpoint is damaged")
    for section, key in _RETIRED_KEYS:
        if isinstance(raw.get(section), dict):
            raw[section].pop(key, None)
    cfg = config_mod.from_dict(raw, str(file))
    cfg.target.trust_remote_code = bool(trust_remote_code)
    return cfg


def load_drafter(path: str | Path, device: str | None = None, target=None,
                 trust_remote_code: bool = False) -> LoadedDrafter:
    """Rebuild a trained drafter (and its target, unless given) from a checkpoint directory.

    The target's custom code runs only with trust_remote_code=True given here (a received
    checkpoint's config.yaml cannot turn it on)."""
    from draftsmith import target as target_mod
    from draftsmith.heads import DRAFTERS

    path = Path(path)
    if not (path / "drafter.json").exists():
        raise FileNotFoundError(f"{path} is not a draftsmith checkpoint (no drafter.json); expected e.g. runs/NAME/final")
    meta = json.loads((path / "drafter.json").read_text())
    cfg = read_config(path, trust_remote_code)
    if target is None:
        target_cfg = cfg.target
        if device is not None:
            target_cfg.device = device
        target = target_mod.from_config(target_cfg)
    expected = meta["target"]["fingerprint"]
    if not target.matches(expected):
        raise ValueError(
            f"{path} was trained for target {meta['target']['name']} (fingerprint {expected}), "
            f"but the loaded target {target.name} has fingerprint {target.fingerprint}; load the same target"
        )
    options = config_mod.drafter_options(cfg)
    drafter = DRAFTERS.get(meta["kind"]).from_target(options, target, None)
    load_weights(path, drafter)
    return LoadedDrafter(drafter=drafter.eval(), target=target, config=cfg, meta=meta)


def load_init_weights(path: str | Path, drafter, target) -> None:
    """train.init_from: warm start `drafter` from a checkpoint directory (drafter.safetensors) or
    from a draftsmith export directory (draftsmith.json + the engine's files), read back through
    that format's own re-import (export/<format>.py load_back)."""
    path = Path(path)
    if (path / "drafter.safetensors").exists():
        return load_weights(path, drafter)
    sidecar_file = path / "draftsmith.json"
    if not sidecar_file.exists():
        raise FileNotFoundError(f"train.init_from={path}: neither a checkpoint (drafter.safetensors) nor a draftsmith "
                                "export (draftsmith.json); give runs/NAME/final or a `draftsmith export` --out directory")
    from draftsmith.export import EXPORTERS

    sidecar = json.loads(sidecar_file.read_text())
    kind, fmt = sidecar.get("drafter_kind"), sidecar.get("format")
    if kind != drafter.kind:
        raise ValueError(f"train.init_from={path}: the export holds a {kind} drafter, this recipe trains "
                         f"{drafter.kind}; warm start from an export of the same kind")
    exported = config_mod.from_dict(sidecar.get("recipe") or {}, str(sidecar_file))
    loaded = LoadedDrafter(drafter=drafter, target=target, config=exported, meta=sidecar.get("checkpoint_meta") or {})
    back = EXPORTERS.get(fmt)().load_back(path, loaded)  # a drafter of this kind (hf: a plain HF model wrapper)
    state = back.state_dict()
    if kind == "draft_lm":  # the hf format holds the bare HF model; the drafter keeps it as `model`
        if getattr(drafter.cfg, "lora", None) is not None:
            raise ValueError(f"train.init_from={path}: an hf export holds merged weights; warm start a LoRA draft LM "
                             "from its checkpoint directory instead")
        state = {f"model.{k}": v for k, v in state.items()}
    missing, unexpected = drafter.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"train.init_from={path} does not fit this drafter: missing {sorted(missing)}, "
                         f"unexpected {sorted(unexpected)}; export and recipe must use the same drafter options")
