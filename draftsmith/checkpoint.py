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
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from draftsmith import __version__
from draftsmith import config as config_mod
from draftsmith.safe_yaml import load as load_yaml


@dataclass
class LoadedDrafter:
    drafter: Any  # heads.base.Drafter
    target: Any  # target.Target
    config: Any  # config.RecipeConfig
    meta: dict


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
    raw = load_yaml(file.read_text(encoding="utf-8"), str(file)) or {}  # bounded: aliases, depth, repeated keys
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


