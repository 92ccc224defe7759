"""Loading, validating and merging result files; refusing mixed definitions or schema versions."""
from __future__ import annotations

import pytest
from result_files import HW_GPU, make_result, workload, write

from draftsmith.report.leaderboard import build_rows
from draftsmith.report.results_io import IncompatibleResultsError, load_results


def test_mixed_definitions_refused_with_clear_message(tmp_path):
    a = write(tmp_path / "a.json", make_result())
    b = write(tmp_path / "b.json", make_result(definitions="chunks-v0"))
    with pytest.raises(IncompatibleResultsError) as err:
        load_results([a, b])
    msg = str(err.value)
    assert "definitions" in msg and "'draftsmith-v1'" in msg and "'chunks-v0'" in msg
    assert str(a) in msg and str(b) in msg


def test_mixed_schema_versions_refused(tmp_path):
    a = write(tmp_path / "a.json", make_result())
    b = write(tmp_path / "b.json", make_result(schema_version=2))
    with pytest.raises(IncompatibleResultsError, match="schema_version=2"):
        load_results([a, b])


def test_unknown_version_refused_even_alone(tmp_path):
    b = write(tmp_path / "b.json", make_result(schema_version=2))
    with pytest.raises(IncompatibleResultsError, match="Upgrade draftsmith"):
        load_results([b])


def test_malformed_files_reported_by_name_and_skipped(tmp_path):
    good = write(tmp_path / "good.json", make_result())
    (tmp_path / "broken.json").write_text("{not json", encoding="utf-8")
    missing_key = make_result()
    del missing_key["workloads"]["spec_bench"]["aggregate"]["acceptance_rate"]
    write(tmp_path / "nokey.json", missing_key)
    short = make_result(k=3)
    short["workloads"]["spec_bench"]["aggregate"]["per_position_acceptance"] = [0.5]
    write(tmp_path / "short.json", short)
    write(tmp_path / "other.json", {"schema": "something-else"})
    results, skipped = load_results([tmp_path])
    assert [r.path.name for r in results] == ["good.json"]
    assert results[0].path == good
    text = "\n".join(skipped)
    assert len(skipped) == 4
    assert "broken.json: not valid JSON" in text
    assert "nokey.json [workload 'spec_bench']: missing key 'acceptance_rate'" in text
    assert "short.json [workload 'spec_bench']: 'per_position_acceptance' must hold k=3" in text
    assert "other.json: 'schema' is 'something-else'" in text


def test_merge_from_two_machines_keeps_every_row(tmp_path):
    # The same drafter run twice on machine A (same key) and once on machine B: three rows, none lost.
    write(tmp_path / "machine-a" / "run1.json", make_result(workloads={"spec_bench": workload(2.0, [0.8, 0.5, 0.4])}))
    write(tmp_path / "machine-a" / "run2.json", make_result(workloads={"spec_bench": workload(2.1, [0.8, 0.5, 0.4])}))
    b = write(tmp_path / "machine-b" / "run.json", make_result(hardware=HW_GPU, workloads={
        "spec_bench": workload(2.05, [0.8, 0.5, 0.4]), "mt_bench": workload(1.5, [0.5, 0.3, 0.2])}))
    results, skipped = load_results([tmp_path / "machine-a", tmp_path / "machine-b", b])  # b named twice: read once
    assert skipped == [] and len(results) == 3
    rows = build_rows(results)
    assert len(rows) == 4
    same_key = [r for r in rows if r.hardware.startswith("cpu") and r.workload == "spec_bench"]
    assert sorted(r.acceptance_length for r in same_key) == [2.0, 2.1]
    assert {r.source.split("/")[-2] for r in rows} == {"machine-a", "machine-b"}


def test_nan_and_null_for_unreached_positions_are_accepted(tmp_path):
    data = make_result(k=3)
    data["workloads"]["spec_bench"]["aggregate"]["per_position_acceptance"] = [0.5, 0.0, None]
    data["workloads"]["spec_bench"]["aggregate"]["tpot_s"] = {"median": float("nan"), "p90": float("nan")}
    path = write(tmp_path / "nan.json", data)
    assert "NaN" in path.read_text()  # Python's json writes bare NaN; it must still load
    (row,) = build_rows(load_results([path])[0])
    assert row.per_position[:2] == [0.5, 0.0] and row.per_position[2] != row.per_position[2]
    assert row.tpot_s is None and row.fmt("tpot_s") == "—"
