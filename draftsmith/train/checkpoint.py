"""Training's side of checkpoints: step directories and their rotation, resume state (optimizer,
scheduler, data position, RNG states in trainer_state.pt), cleanup of interrupted writes, and
train.init_from warm starts. Writing and reading a checkpoint directory is draftsmith/checkpoint.py.
"""
from __future__ import annotations

import json
import pickle
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from draftsmith import config as config_mod
from draftsmith.checkpoint import LoadedDrafter, check_vocab_map, fit_state, load_weights, save
from draftsmith.core.errors import UserError
from draftsmith.core.files import read_json_object

STEP_PREFIX = "step_"


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


def set_rng_state(state: dict, source: str = "trainer_state.pt") -> None:
    """Restore rng_state(); a state of the wrong size or type (a 3-byte torch state) is one line naming `source`."""
    try:
        _set_rng_state(state)
    except (RuntimeError, TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise UserError(f"{source}: its RNG state does not restore ({type(exc).__name__}: "
                        f"{' '.join(str(exc).split())[:120]}); the checkpoint is damaged: resume from an earlier one "
                        "or warm start with train.init_from") from None


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py["version"], tuple(int(w) for w in py["state"].tolist()), py["gauss"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], npy["keys"].numpy().astype(np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


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


def resume_point(output_dir: Path) -> Path | None:
    """What train.resume=true continues from: the newest written of the step checkpoints and `final`
    (a finished run extended with a larger max_steps continues from its last step, not from the
    step checkpoint before it, which would redo the steps in between)."""
    final = Path(output_dir) / "final"
    found = step_dirs(output_dir)
    if (final / "COMPLETE").exists() and (final / "trainer_state.pt").exists():
        found = sorted([*found, final], key=_write_order)
    return found[-1] if found else None


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
        raise UserError(
            f"{file} holds objects other than tensors and plain data, which could run code when loaded "
            f"({first}); refused. Resume only from checkpoints written by this draftsmith, or warm start "
            "from the weights alone with train.init_from (safetensors)") from None


def load_init_weights(path: str | Path, drafter, target) -> None:
    """train.init_from: warm start `drafter` from a checkpoint directory (drafter.safetensors) or
    from a draftsmith export directory (draftsmith.json + the engine's files), read back through
    that format's own re-import (export/<format>.py load_back)."""
    path = Path(path)
    if (path / "drafter.safetensors").exists():
        if (path / "drafter.json").exists():
            check_same_feature_layers(read_json_object(path / "drafter.json", "checkpoint's drafter.json")
                                      .get("feature_layers"), drafter, path)
        load_weights(path, drafter)
        return check_vocab_map(drafter.state_dict(), target.vocab_size, f"train.init_from={path}")
    sidecar_file = path / "draftsmith.json"
    if not sidecar_file.exists():
        raise FileNotFoundError(f"train.init_from={path}: neither a checkpoint (drafter.safetensors) nor a draftsmith "
                                "export (draftsmith.json); give runs/NAME/final or a `draftsmith export` --out directory")
    from draftsmith.export import EXPORTERS

    try:
        sidecar = json.loads(sidecar_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise UserError(f"train.init_from={path}: {sidecar_file} is not readable JSON "
                         f"({' '.join(str(exc).split())[:120]}); export the drafter again") from None
    if not isinstance(sidecar, dict):
        raise UserError(f"train.init_from={path}: {sidecar_file} is a JSON {type(sidecar).__name__}, not the export's "
                         "sidecar object; export the drafter again")
    kind, fmt = sidecar.get("drafter_kind"), sidecar.get("format")
    if kind != drafter.kind:
        raise UserError(f"train.init_from={path}: the export holds a {kind} drafter, this recipe trains "
                         f"{drafter.kind}; warm start from an export of the same kind")
    check_same_feature_layers(sidecar.get("aux_layer_ids"), drafter, path)
    recipe = sidecar.get("recipe") or {}
    if not isinstance(recipe, dict):  # `recipe: "x"`: AttributeError inside from_dict before
        raise UserError(f"train.init_from={path}: {sidecar_file}'s recipe is a JSON {type(recipe).__name__}, not the "
                        "export's recipe mapping; export the drafter again")
    exported = config_mod.from_dict(recipe, str(sidecar_file))
    loaded = LoadedDrafter(drafter=drafter, target=target, config=exported, meta=sidecar.get("checkpoint_meta") or {})
    back = EXPORTERS.get(fmt)().load_back(path, loaded)  # a drafter of this kind (hf: a plain HF model wrapper)
    # the drafter's own state_dict names (a re-imported HF model says how its names map onto the drafter's)
    state = back.drafter_state_dict(drafter, path) if hasattr(back, "drafter_state_dict") else back.state_dict()
    check_vocab_map(state, target.vocab_size, f"train.init_from={path}")
    fit_state(state, drafter, f"train.init_from={path} (export and recipe must use the same drafter options)")


def check_same_feature_layers(recorded, drafter, path: Path) -> None:
    """A warm start must read the target's layers in the order its weights were trained on: fc's input
    columns are the aux layers in that order, so [3, 1, 2] weights under [1, 2, 3] are silently wrong."""
    if isinstance(recorded, list) and list(recorded) != list(drafter.feature_layers()):
        raise UserError(f"train.init_from={path} was trained on target layers {recorded} (in that order), this recipe "
                         f"reads {drafter.feature_layers()}: set drafter.aux_layer_ids to {recorded} or start from scratch")
