"""`draftsmith train RECIPE --nproc N` re-launches under torchrun; it refuses a single-process backend."""
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
    recipe.write_text("name: r\n")
    assert launch.relaunch_under_torchrun(2, str(recipe), []) == 2
    assert "train.backend=ddp" in capsys.readouterr().err
