"""Weights are received files (issue 44 item 17): a drafter.safetensors (or a target's model.safetensors)
that is a FIFO hung `eval` and `export` in the header read; it is one line saying what the path is."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from draftsmith.checkpoint import read_weights
from draftsmith.core.errors import UserError
from draftsmith.core.files import check_safetensors


@pytest.fixture
def alarm():
    """A hang fails the test after 20 s instead of blocking the suite."""
    def fire(*_):
        raise TimeoutError("the read blocked: a FIFO was opened for reading")
    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(20)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def test_a_fifo_drafter_safetensors_is_one_line(tmp_path, alarm):
    os.mkfifo(tmp_path / "drafter.safetensors")
    with pytest.raises(UserError, match=r"drafter.safetensors: is a FIFO \(named pipe\), not a regular file"):
        read_weights(tmp_path)


@pytest.mark.parametrize("kind", ["directory", "link to /dev/zero"])
def test_other_special_weights_are_refused(tmp_path, alarm, kind):
    path = tmp_path / "model.safetensors"
    path.mkdir() if kind == "directory" else path.symlink_to("/dev/zero")
    with pytest.raises(UserError, match="not a regular file"):
        check_safetensors(path)


def test_a_regular_file_still_reads(tmp_path):
    import torch
    from safetensors.torch import save_file

    save_file({"w": torch.ones(2, 3)}, str(tmp_path / "m.safetensors"))
    assert check_safetensors(Path(tmp_path / "m.safetensors"))["w"]["shape"] == [2, 3]
