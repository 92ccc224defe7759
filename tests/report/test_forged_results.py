"""Issue 22 (trust, round 3), results, reports and leaderboards: forged numbers are refused and never
ranked first, a training_log is read only from beside its result and bounded, `report` never writes
over its own result nor passes terminal escapes on, an interrupted leaderboard leaves no page-less
plots, and a --profile that is not an object is one line."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from result_files import make_result, workload, write

from draftsmith.cli import main as cli_main
from draftsmith.report import plots
from draftsmith.report.leaderboard_site import build_leaderboard
from draftsmith.report.results_io import load_results


@pytest.mark.parametrize("key, value, message", [
    ("acceptance_length.pooled", 1e308, "outside \\[1, k \\+ 1 = 4\\]"),
    ("acceptance_length.mean", -3.0, "outside \\[1, k \\+ 1 = 4\\]"),
    ("acceptance_rate", 5.0, "outside \\[0, 1\\]"),
    ("speedup.median", -1e308, "outside \\(0, 1000\\]"),
    ("speedup.median", 1e308, "outside \\(0, 1000\\]"),
    ("ttft_s.median", float("inf"), "expected a finite number"),
])
def test_forged_numbers_are_refused_and_never_ranked_first(tmp_path, key, value, message):
    honest = write(tmp_path / "honest.json", make_result(drafter="honest", workloads={"w": workload(2.5, [0.8, 0.5, 0.3])}))
    forged = make_result(drafter="forged", workloads={"w": workload(3.9, [0.99, 0.99, 0.99], speedup=3.0)})
    section, name = key.split(".") if "." in key else (key, None)
    agg = forged["workloads"]["w"]["aggregate"]
    if name is None:
        agg[section] = value
    else:
        agg[section][name] = value
    bad = write(tmp_path / "forged.json", forged)
    results, skipped = load_results([honest, bad])
    assert [r.path.name for r in results] == ["honest.json"]
    assert len(skipped) == 1 and "forged.json" in skipped[0] and f"'{key}'" in skipped[0]
    assert re.search(message, skipped[0]), skipped[0]
    out = build_leaderboard([honest, bad], tmp_path / "lb")
    assert [r.drafter for r in out.rows] == ["honest"]


def test_a_training_log_is_read_only_from_beside_the_result(tmp_path, capsys):
    secret = tmp_path / "elsewhere" / "metrics.jsonl"
    secret.parent.mkdir()
    secret.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")
    results_dir = tmp_path / "received"
    for name, log in (("abs", str(secret)), ("up", "../elsewhere/metrics.jsonl")):
        res = write(results_dir / f"{name}.json", make_result(training_log=log))
        out = build_leaderboard([res], tmp_path / f"lb-{name}")
        assert out.training_plots == [] and any("is read only from beside the result" in n for n in out.notes)
        assert cli_main(["report", str(res), "--no-html"]) == 0
        assert "read only from beside the result" in capsys.readouterr().err
    link = results_dir / "metrics.jsonl"
    link.symlink_to(secret)  # a link beside the result that leads out of its directory
    res = write(results_dir / "link.json", make_result(training_log="metrics.jsonl"))
    assert build_leaderboard([res], tmp_path / "lb-link").training_plots == []
    link.unlink()
    link.write_text(json.dumps({"step": 1, "loss": 2.0}) + "\n")  # a real file beside it is plotted, by any name
    res = write(results_dir / "beside.json", make_result(training_log=str(tmp_path / "runs" / "x" / "metrics.jsonl")))
    assert len(build_leaderboard([res], tmp_path / "lb-beside").training_plots) == 1


def test_a_huge_training_log_is_refused_without_reading_it(tmp_path, monkeypatch):
    log = tmp_path / "metrics.jsonl"
    with open(log, "wb") as f:  # sparse: 50 GB on paper, nothing on disk
        f.truncate(50 * 2**30)
    monkeypatch.setattr(plots, "MAX_TRAINING_LOG_BYTES", 1024)
    with pytest.raises(ValueError, match=r"metrics.jsonl: 53,687,091,200 bytes is more than a training log may hold"):
        plots.read_training_log(log)
    res = write(tmp_path / "r.json", make_result(training_log="metrics.jsonl"))
    out = build_leaderboard([res], tmp_path / "lb")
    assert out.training_plots == [] and any("more than a training log may hold" in n for n in out.notes)


def test_report_refuses_to_write_its_html_over_the_result(tmp_path, capsys):
    res = write(tmp_path / "run.html", make_result())  # a result whose name ends in .html
    before = res.read_bytes()
    assert cli_main(["report", str(res)]) == 2
    assert "is the result file itself" in capsys.readouterr().err
    other = write(tmp_path / "run.json", make_result())
    assert cli_main(["report", str(other), "--html", str(other)]) == 2
    assert res.read_bytes() == before and json.loads(other.read_text())["schema"] == "draftsmith.eval-results"


def test_report_and_readme_strip_terminal_escapes(tmp_path, capsys):
    evil = "\x1b]0;pwned\x07\x1b[2J\x1b[31mred\x1b[0m\x9b1mdrafter\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\\r"
    res = write(tmp_path / "evil.json", make_result(drafter=evil, target="t\x1b[8mhidden", workloads={
        f"w\x1b[1A{evil}": workload(2.0, [0.8, 0.5, 0.4])}))
    assert cli_main(["report", str(res), "--no-html"]) == 0
    out = capsys.readouterr()
    for text in (out.out, out.err):
        assert "\x1b" not in text and "\x9b" not in text and "\r" not in text
    assert "reddrafterlink" in out.out
    lb = build_leaderboard([res], tmp_path / "lb")
    readme = lb.readme.read_text(encoding="utf-8")
    assert "\x1b" not in readme and "\x07" not in readme and "reddrafterlink" in readme


def test_sigint_during_a_leaderboard_leaves_no_plots_without_a_page(tmp_path):
    res = write(tmp_path / "r.json", make_result())
    out = tmp_path / "lb"
    script = textwrap.dedent(f"""
        import os, signal
        signal.signal(signal.SIGINT, signal.default_int_handler)  # a runner started in the background ignores SIGINT
        from draftsmith.report import leaderboard_site as cli_leaderboard
        real = cli_leaderboard.render_markdown
        def interrupted(*a, **k):  # the plots are drawn; the page is not written yet
            os.kill(os.getpid(), signal.SIGINT)
            return real(*a, **k)
        cli_leaderboard.render_markdown = interrupted
        cli_leaderboard.build_leaderboard([{str(res)!r}], {str(out)!r})
    """)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "KeyboardInterrupt" in proc.stderr
    assert not out.exists()  # nothing half-built where the page should be
    assert not [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the build directory is gone too
    first = build_leaderboard([res], out)
    assert first.index_html.exists() and all(p.exists() and out in p.parents for s in first.sections for p in s.plots)
    (out / "mine.txt").write_text("kept")  # a second build replaces the board, not the user's files
    build_leaderboard([res], out)
    assert (out / "mine.txt").read_text() == "kept" and (out / "index.html").exists()


@pytest.mark.parametrize("text, message", [("[1, 2]", "a JSON list, not a speedup_profile.json object"),
                                           ('{"schema": "draftsmith.speedup-profile"}', "not a complete"),
                                           ("[" * 50_000, "not a readable")])
def test_a_profile_that_is_not_an_object_is_one_line(tmp_path, capsys, text, message):
    res = write(tmp_path / "r.json", make_result())
    prof = tmp_path / "speedup_profile.json"
    prof.write_text(text)
    assert cli_main(["leaderboard", str(res), "--out", str(tmp_path / "lb"), "--profile", str(prof)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"--profile {prof}: " in err[0] and message in err[0], err

