"""Issue 34 (trust, round 4), core/files.py: user-named outputs are never device nodes, FIFOs or
sockets; received files are read as regular files of bounded size; a full disk is one line."""
from __future__ import annotations

import errno
import os
import socket

import pytest

from draftsmith.core import files
from draftsmith.core.errors import UserError


def _special(tmp_path, kind: str):
    path = tmp_path / kind
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        sock = socket.socket(socket.AF_UNIX)
        sock.bind(str(path))
        sock.close()
    elif kind == "chardev":
        if os.geteuid() != 0:
            pytest.skip("mknod of a character device needs root")
        os.mknod(path, 0o666 | 0o020000, os.makedev(1, 3))  # a copy of /dev/null's device node
    elif kind == "link-to-fifo":
        os.mkfifo(tmp_path / "fifo-target")
        path.symlink_to(tmp_path / "fifo-target")
    return path


@pytest.mark.parametrize("kind", ["fifo", "socket", "chardev", "link-to-fifo"])
def test_write_text_atomically_refuses_special_files(tmp_path, kind):
    path = _special(tmp_path, kind)
    mode = os.lstat(path).st_mode
    with pytest.raises(UserError, match=f"--out {path}: is .*not a regular file"):
        files.write_text_atomically(path, "{}", "--out")
    assert os.lstat(path).st_mode == mode  # not replaced by a regular file
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_write_text_atomically_writes_a_new_or_regular_file(tmp_path):
    files.write_text_atomically(tmp_path / "new" / "r.json", "a")
    (tmp_path / "old.json").write_text("old")
    files.write_text_atomically(tmp_path / "old.json", "b")
    assert (tmp_path / "new" / "r.json").read_text() == "a" and (tmp_path / "old.json").read_text() == "b"


def test_a_full_disk_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    (tmp_path / "r.html").write_text("previous")

    def no_room(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    with pytest.raises(OSError):
        files.write_text_atomically(tmp_path / "r.html", "<html>", "--html")
    with pytest.raises(UserError, match="r.html: no space left"):
        with files.disk_full_guard(tmp_path / "r.html", "HTML report"):
            files.write_text_atomically(tmp_path / "r.html", "<html>", "--html")
    assert (tmp_path / "r.html").read_text() == "previous"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html"]


@pytest.mark.parametrize("kind", ["fifo", "chardev", "link-to-fifo"])
def test_received_special_files_are_refused_without_waiting(tmp_path, kind):
    path = _special(tmp_path, kind)
    with pytest.raises(UserError, match=f"{path}: is .*not a regular file"):
        files.read_received_bytes(path, "drafter.json")


def test_a_link_to_dev_zero_is_refused(tmp_path):
    (tmp_path / "drafter.json").symlink_to("/dev/zero")
    with pytest.raises(UserError, match="drafter.json: is a character device"):
        files.read_json_object(tmp_path / "drafter.json", "checkpoint's drafter.json")


def test_received_files_are_bounded_in_size(tmp_path):
    path = tmp_path / "big.json"
    path.write_bytes(b" " * 2001)
    with pytest.raises(UserError, match="big.json: 2,001 bytes, more than the 2,000"):
        files.read_received_bytes(path, "speedup profile", 2000)
    assert files.read_received_bytes(path, "speedup profile", 2001) == b" " * 2001


def test_utf16_and_deep_nesting_name_the_file(tmp_path):
    path = tmp_path / "speedup_profile.json"
    path.write_text('{"schema": 1}', encoding="utf-16")
    with pytest.raises(UserError, match="speedup_profile.json: not UTF-8 text"):
        files.read_json_object(path, "speedup profile")
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(UserError, match="speedup_profile.json: nested too deeply"):
        files.read_json_object(path, "speedup profile")
