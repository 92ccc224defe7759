"""Issue 34 (trust, round 4), reports and leaderboards: outputs are never device nodes or FIFOs, a full
disk leaves no 0-byte page, received result and profile files are regular files of bounded size, and
huge or forged values in a result are one line."""
from __future__ import annotations

import errno
import json
import os

from result_files import make_result, workload, write

from draftsmith.cli import main as cli_main
from tests.conftest import refused_in_one_line


def test_report_html_that_is_a_fifo_is_refused(tmp_path, capsys):
    result = write(tmp_path / "r.json", make_result())
    os.mkfifo(tmp_path / "page.html")
    refused_in_one_line(capsys, ["report", str(result), "--html", str(tmp_path / "page.html")], "--html", "FIFO")
    assert os.path.exists(tmp_path / "page.html") and not (tmp_path / "page.html").is_file()


def test_report_on_a_full_disk_leaves_no_empty_page(tmp_path, capsys, monkeypatch):
    result = write(tmp_path / "r.json", make_result())
    page = tmp_path / "r.html"
    page.write_text("old page")

    def no_room(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_room)
    refused_in_one_line(capsys, ["report", str(result)], "r.html", "no space left")
    assert page.read_text() == "old page"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.html", "r.json"]


def test_a_result_linked_to_dev_zero_or_a_fifo_is_one_line(tmp_path, capsys):
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    refused_in_one_line(capsys, ["report", str(tmp_path / "zero.json"), "--no-html"], "zero.json", "character device")
    os.mkfifo(tmp_path / "fifo.json")
    refused_in_one_line(capsys, ["report", str(tmp_path / "fifo.json"), "--no-html"], "fifo.json", "FIFO")


def test_leaderboard_files_that_are_fifos_are_refused(tmp_path, capsys):
    result = write(tmp_path / "res" / "r.json", make_result())
    (tmp_path / "lb").mkdir()
    os.mkfifo(tmp_path / "lb" / "index.html")
    refused_in_one_line(capsys, ["leaderboard", str(tmp_path / "res"), "--out", str(tmp_path / "lb")], "index.html", "FIFO")
    assert not (tmp_path / "lb" / "index.html").is_file()
    assert result.exists()


def test_leaderboard_profile_linked_to_dev_zero_is_one_line(tmp_path, capsys):
    write(tmp_path / "res" / "r.json", make_result())
    (tmp_path / "speedup_profile.json").symlink_to("/dev/zero")
    refused_in_one_line(capsys, ["leaderboard", str(tmp_path / "res"), "--out", str(tmp_path / "lb"),
                       "--profile", str(tmp_path / "speedup_profile.json")], "speedup_profile.json", "character device")


def test_a_tau_of_10_to_the_400_is_one_line(tmp_path, capsys):
    data = make_result(workloads={"w": workload(2.0, [0.8, 0.5, 0.3])})
    text = json.dumps(data).replace('"pooled": 2.0', '"pooled": 1' + "0" * 400)
    assert "0" * 400 in text
    (tmp_path / "r.json").write_text(text)
    refused_in_one_line(capsys, ["report", str(tmp_path / "r.json"), "--no-html"], "acceptance_length.pooled", "401 digits")


def test_3001_workloads_or_a_5mb_name_are_refused_quickly(tmp_path, capsys):
    import time

    many = make_result(workloads={f"w{i}": workload(2.0, [0.8, 0.5, 0.3]) for i in range(3001)})
    write(tmp_path / "many.json", many)
    named = make_result(drafter="d" * (5 << 20))
    write(tmp_path / "named.json", named)
    start = time.monotonic()
    refused_in_one_line(capsys, ["report", str(tmp_path / "many.json"), "--no-html"], "many.json", "3,001 workloads")
    refused_in_one_line(capsys, ["report", str(tmp_path / "named.json"), "--no-html"], "named.json", "drafter.name",
              "5,242,880 characters")
    capsys.readouterr()
    assert cli_main(["leaderboard", str(tmp_path / "many.json"), str(tmp_path / "named.json"),
                     "--out", str(tmp_path / "lb")]) == 2
    assert time.monotonic() - start < 30


def test_no_escape_reaches_stderr_through_matplotlibs_missing_glyph_warning(tmp_path, capfd):
    result = write(tmp_path / "r.json", make_result(drafter="evil\x1b]0;owned\x07\x1b[2J",
                                                    workloads={"w\x1b[31m": workload(2.0, [0.8, 0.5, 0.3])}))
    import warnings

    with warnings.catch_warnings(record=True) as caught:  # outside pytest a warning prints on stderr
        warnings.simplefilter("always")
        assert cli_main(["report", str(result), "--html", str(tmp_path / "r.html")]) == 0
    out, err = capfd.readouterr()
    err += "".join(str(w.message) for w in caught)
    assert "\x1b" not in out and "\x1b" not in err and "\x07" not in err
