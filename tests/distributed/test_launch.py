"""`draftsmith train RECIPE --nproc N` re-launches under torchrun: ddp when the recipe names no backend,
refused when it sets the single-process backend."""
from __future__ import annotations

import sys
from pathlib import Path

from draftsmith.train import launch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def test_torchrun_command_runs_the_same_train_command():
    cmd = launch.torchrun_command(8, "r.yaml", ["train.backend=fsdp2"])
    assert cmd[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8",
                       "-m", "draftsmith", "train", "r.yaml", "train.backend=fsdp2"]


def test_nproc_with_single_backend_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ntrain:\n  backend: single\n")
    assert launch.relaunch_under_torchrun(2, str(recipe), []) == 2
    assert "train.backend=ddp" in capsys.readouterr().err
    recipe.write_text("name: r\n")
    assert launch.relaunch_under_torchrun(2, str(recipe), ["train.backend=single"]) == 2


def test_nproc_without_backend_picks_ddp(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\n")
    launched = []

    class Done:
        returncode = 0

    monkeypatch.setattr(launch.subprocess, "run", lambda cmd, check: launched.append(cmd) or Done())
    assert launch.relaunch_under_torchrun(2, str(recipe), ["train.max_steps=3"]) == 0
    assert launched[0][-2:] == ["train.max_steps=3", "train.backend=ddp"]
    assert "using train.backend=ddp" in capsys.readouterr().out
