"""benchmarks/plot_peer_curves.py and report/plots.curves_side_by_side: bench_peer_recipe reports and train
runs drawn as held-out acc_i against tokens, one panel per position, one line per trainer."""
from __future__ import annotations

import json
import sys

import pytest

from draftsmith.core.errors import UserError
from draftsmith.report import plots
from tests.conftest import REPO
from tests.report.test_learning_curve import synthetic_log

sys.path.insert(0, str(REPO / "benchmarks"))
import plot_peer_curves  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def _report(path, scale_ds=1.0, scale_sp=0.9):
    def curve(scale):
        return [{"step": s, "tokens_seen": 1e4 * s, **{f"eval_acc_{i}": scale * s / 100 / (i + 1) for i in range(3)}}
                for s in (20, 40, 60)]
    path.write_text(json.dumps({"draftsmith": {"curve": curve(scale_ds)}, "speculators": {"curve": curve(scale_sp)}}))
    return path


def test_each_trainer_of_each_report_and_each_run_is_a_line(tmp_path):
    report = _report(tmp_path / "peer.json")
    run = synthetic_log(tmp_path / "run", noise=0.0)
    series = {**plot_peer_curves.series_of([report], ["rows A"]),
              **plot_peer_curves.run_series([f"draftsmith, later=={run}"])}  # the label may hold '='
    assert sorted(series) == ["draftsmith, later=", "draftsmith, rows A", "speculators, rows A"]
    later = series["draftsmith, later="]  # the run's own held-out evaluations, in step order
    assert len(later) > 4 and later[0][0] < later[-1][0] and all(len(accs) >= 1 for _, accs in later)
    assert series["speculators, rows A"][1] == (4e5, pytest.approx((0.36, 0.18, 0.12)))
    assert series["draftsmith, rows A"][2][1][0] == pytest.approx(0.6)
    only = plot_peer_curves.series_of([report], [], ["speculators"])
    assert list(only) == [f"speculators, {report}"]


def test_writes_a_png_per_position_panel(tmp_path):
    out = tmp_path / "curves.png"
    assert plot_peer_curves.main([str(_report(tmp_path / "peer.json")), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG)


def test_bad_arguments_are_one_line_and_exit_2(tmp_path, capsys):
    report = _report(tmp_path / "peer.json")
    assert plot_peer_curves.main([str(report), "--label", "a", "--label", "b", "--out", str(tmp_path / "x.png")]) == 2
    assert "--label given 2 times for 1 reports" in capsys.readouterr().err
    assert plot_peer_curves.main(["--run", "nolabel", "--out", str(tmp_path / "x.png")]) == 2
    assert "give LABEL=RUN_DIR" in capsys.readouterr().err
    assert plot_peer_curves.main([str(report), "--peers", "eagle", "--out", str(tmp_path / "x.png")]) == 2
    assert "unknown eagle" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{")
    assert plot_peer_curves.main([str(tmp_path / "bad.json"), "--out", str(tmp_path / "x.png")]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert plot_peer_curves.main(["--out", str(tmp_path / "x.png")]) == 2
    assert "nothing to draw" in capsys.readouterr().err
    assert plot_peer_curves.main([str(report), str(report), "--out", str(tmp_path / "x.png")]) == 2  # same default label
    assert "two curves are named" in capsys.readouterr().err
    assert plot_peer_curves.main([str(report), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("damage, message", [
    ([5], "row 0: a int, not an evaluation object"),
    ([{"tokens_seen": 1e4, "eval_acc_0": "abc"}], "row 0: tokens_seen must be a number"),
    ([{"tokens_seen": 1e4, "eval_acc_0": None}], "eval_acc_* numbers in 0..1"),
    ([{"tokens_seen": "x", "eval_acc_0": 0.5}], "tokens_seen='x'"),
    ([{"tokens_seen": 1e4, "eval_acc_0": 1.5}], "eval_acc_* numbers in 0..1"),
])
def test_a_damaged_curve_is_one_line_naming_the_file_and_row(tmp_path, capsys, damage, message):
    path = tmp_path / "peer.json"
    path.write_text(json.dumps({"speculators": {"curve": damage}}))
    assert plot_peer_curves.main([str(path), "--out", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert message in err and f"{path}: the speculators curve" in err and "Traceback" not in err
    path.write_text(json.dumps({"other": 1}))
    assert plot_peer_curves.main([str(path), "--out", str(tmp_path / "x.png")]) == 2
    assert "holds no draftsmith or speculators curve" in capsys.readouterr().err


def test_no_curve_is_refused(tmp_path):
    with pytest.raises(UserError, match="no curve to draw"):
        plots.curves_side_by_side({"empty": []}, tmp_path / "x.png", "t")
