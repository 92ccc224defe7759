"""Issue 22 (trust, round 3), training: one training per output dir at a time, a loss that turns NaN
stops the run and keeps the last good checkpoint, a damaged trainer state or init_from sidecar is
one line, rows past the target's positions are refused up front, and a full disk while writing a
checkpoint loses nothing already written."""
from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest
import torch

from draftsmith import checkpoint as ckpt_io
from draftsmith import cli, config
from draftsmith.core.errors import UserError
from draftsmith.train import checkpoint
from draftsmith.train.loop import Trainer, TrainingDivergedError, train
from draftsmith.train.run_lock import LOCK_FILE, RunDirBusyError


def _recipe_file(tmp_path, cfg) -> Path:
    path = tmp_path / f"{Path(cfg.train.output_dir).name}.yaml"
    path.write_text(config.to_yaml(cfg))
    return path


def test_a_second_training_into_the_same_output_dir_exits_2_naming_it(tiny_run, tmp_path, capsys):
    cfg = tiny_run("shared", "train.max_steps=2")
    first = Trainer(cfg)  # holds the directory until its run ends
    recipe = _recipe_file(tmp_path, tiny_run("shared", "train.max_steps=2"))
    assert cli.main(["train", str(recipe)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"train.output_dir {cfg.train.output_dir} is in use by another training" in err[0]
    first.run()  # the first one is unaffected and releases the lock at its end
    assert (Path(cfg.train.output_dir) / "final" / "COMPLETE").exists()
    train(tiny_run("shared", "train.max_steps=3"), overwrite=True)  # free again
    assert (Path(cfg.train.output_dir) / LOCK_FILE).exists()


def test_a_failed_setup_releases_the_lock(tiny_run):
    cfg = tiny_run("setup", "data.max_length=4096")  # the tiny target has 1,024 positions
    with pytest.raises(UserError, match=r"data.max_length=4,096 is past the target's 1,024 positions"):
        Trainer(cfg)
    train(tiny_run("setup", "train.max_steps=1"))  # not left locked by the refused run


def test_lock_is_refused_while_held(tmp_path):
    from draftsmith.train.run_lock import RunLock

    held = RunLock.acquire(tmp_path / "run")
    with pytest.raises(RunDirBusyError, match=r"in use by another training \(pid \d+\)"):
        RunLock.acquire(tmp_path / "run")
    held.release()
    RunLock.acquire(tmp_path / "run").release()


def test_a_loss_that_turns_nan_stops_the_run_and_keeps_the_last_good_checkpoint(tiny_run):
    cfg = tiny_run("nan", "train.save_every=2", "train.max_steps=6", "train.log_every=100")
    trainer = Trainer(cfg)
    model, calls = trainer.model, []

    def poisoned(batch):
        out = model(batch)
        calls.append(1)
        if len(calls) == 3:  # step 3's loss (and from there the weights) turn NaN
            out.loss = out.loss * float("nan")
        return out

    trainer.model = poisoned
    with pytest.raises(TrainingDivergedError, match=r"loss became nan at step 3.*last good checkpoint is .*step_0000002"):
        trainer.run()
    out = Path(cfg.train.output_dir)
    assert [p.name for p in checkpoint.step_dirs(out)] == ["step_0000002"]
    assert not (out / "final").exists()
    weights = ckpt_io.read_weights(out / "step_0000002")
    assert all(torch.isfinite(t).all() for t in weights.values() if t.is_floating_point())


def test_the_cli_exits_non_zero_on_a_nan_loss(tiny_run, tmp_path, capsys, monkeypatch):
    from draftsmith.train import loop

    real = loop.Trainer._train_step

    def nan_step(self):
        m = real(self)
        m["loss"] = m["loss"] * float("nan")
        return m

    monkeypatch.setattr(loop.Trainer, "_train_step", nan_step)
    recipe = _recipe_file(tmp_path, tiny_run("nan-cli", "train.max_steps=2"))
    assert cli.main(["train", str(recipe)]) == 2
    assert "the loss became nan at step 1" in capsys.readouterr().err


def test_trainer_state_with_a_negative_step_is_refused(tiny_run):
    cfg = tiny_run("neg", "train.save_every=2", "train.max_steps=4")
    train(cfg)
    step_dir = Path(cfg.train.output_dir) / "step_0000002"
    state = checkpoint.load_trainer_state(step_dir)
    for bad, message in ((-1000, r"step -1000 is not a step count"), (2.5, r"step 2.5 is not a step count"),
                         (None, r"step None is not a step count")):
        torch.save({**state, "step": bad}, step_dir / "trainer_state.pt")
        with pytest.raises(UserError, match=rf"trainer_state.pt: {message}"):
            Trainer(tiny_run("neg", "train.max_steps=4", f"train.resume={step_dir}")).run()
    torch.save({"step": 2}, step_dir / "trainer_state.pt")
    with pytest.raises(UserError, match=r"trainer_state.pt: missing \['optimizer'"):
        Trainer(tiny_run("neg", "train.max_steps=4", f"train.resume={step_dir}")).run()


@pytest.mark.parametrize("text, message", [("[1, 2]", "is a JSON list"), ("{garbled", "is not readable JSON"),
                                           ("[" * 100_000, "is not readable JSON")])
def test_a_bad_init_from_sidecar_is_one_line(tiny_run, tmp_path, text, message):
    export = tmp_path / "export"
    export.mkdir()
    (export / "draftsmith.json").write_text(text)
    with pytest.raises(ValueError, match=rf"train.init_from={export}: .*draftsmith.json {message}"):
        Trainer(tiny_run("warm", f"train.init_from={export}"))


@pytest.mark.parametrize("nproc", ["0", "-3"])
def test_nproc_below_one_is_refused(tiny_run, tmp_path, capsys, nproc):
    recipe = _recipe_file(tmp_path, tiny_run("np"))
    assert cli.main(["train", str(recipe), "--nproc", nproc]) == 2
    assert f"--nproc {nproc}: must be >= 1" in capsys.readouterr().err


def test_a_full_disk_while_writing_final_keeps_the_last_checkpoint(tiny_run, monkeypatch):
    real = ckpt_io.save_file

    def full_disk(tensors, path):
        if "final" in str(path):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(tensors, path)

    monkeypatch.setattr(ckpt_io, "save_file", full_disk)
    cfg = tiny_run("full", "train.save_every=2", "train.max_steps=4")
    with pytest.raises(UserError, match=r"could not write the checkpoint .*final at step 4 \(.*No space left on device\)"
                                        r"; the last checkpoint .*step_0000002 is kept.*train.resume=true"):
        train(cfg)
    out = Path(cfg.train.output_dir)
    assert (out / "step_0000002" / "COMPLETE").exists() and not (out / "final").exists()
    assert not [p.name for p in out.iterdir() if ".tmp-" in p.name]  # no half-written final left beside it
    assert json.loads((out / "metrics.jsonl").read_text().splitlines()[-1])["step"] == 4
    monkeypatch.setattr(ckpt_io, "save_file", real)
    resumed = train(tiny_run("full", "train.save_every=2", "train.max_steps=4", "train.resume=true"))
    assert (resumed.final_checkpoint / "COMPLETE").exists()


def test_a_drafting_block_past_the_targets_positions_is_refused_up_front(tiny_run):
    raw = config.to_dict(tiny_run("block"))
    raw["drafter"] = {"kind": "dflash", "block_size": 5000}  # past any engine's k first (bounds.MAX_DRAFT_TOKENS)
    with pytest.raises(config.ConfigError, match=r"drafter.block_size: must be >= 2 and <= 65, got 5000"):
        config.from_dict(raw)
    raw["drafter"] = {"kind": "dflash", "block_size": 40}
    raw["data"]["max_length"] = 8  # a block past a short target's positions is still refused before any data loads
    cfg = config.from_dict(raw)
    from types import SimpleNamespace

    from draftsmith.train.loop import check_positions

    short = SimpleNamespace(config=SimpleNamespace(max_position_embeddings=32), name="short")
    with pytest.raises(UserError, match=r"drafter.block_size=40 is past the target's 32 positions"):
        check_positions(cfg, cfg.drafter.options, short)
