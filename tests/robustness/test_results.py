"""Robustness harness: damaged and hostile result files (what `draftsmith eval` writes, as received
from someone else) and bad flags through `report` and `leaderboard`, in-process, each case in a
forked child under a CPU-time and memory limit (tests/robustness/sandbox.py says what is asserted).

Generated inputs per test in CI (DRAFTSMITH_HARNESS_EXAMPLES=N runs N random ones instead):
  report:      16 bad values anywhere in the result (half with --no-html), 8 damaged documents,
               4 bad flags; fixed: a 4 GB sparse training_log, 2 escape sequences, 2 deep nestings,
               --html onto the result
  leaderboard: 8 bad values anywhere in the result (beside a good copy), 4 damaged documents,
               3 bad flags, 3 bad --profile files
Known findings of issue 22 have their own tests (they failed before the fixes).
"""
from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.robustness import strategies as S
from tests.robustness import world
from tests.robustness.conftest import harness_settings
from tests.robustness.sandbox import Case

RESULT = world.RESULT
HTML = RESULT.removesuffix(".json") + ".html"


def _result_paths(world_dir) -> list[tuple]:
    return S.json_paths(json.loads((world_dir / RESULT).read_text()))


def _report(damage: S.Damage | None, extra: list[str] = (), names: list[str] = (), **kw) -> Case:
    return Case(["report", RESULT, *extra], names=list(names) + (damage.names if damage else []) + [RESULT],
                outputs=[HTML], seconds=kw.pop("seconds", 60), no_control=True, **kw)


def _leaderboard(damage: S.Damage | None, extra: list[str] = (), names: list[str] = (), **kw) -> Case:
    return Case(["leaderboard", "results", "more/copy.json", "--out", "lb", *extra],
                names=list(names) + (damage.names if damage else []) + [RESULT], outputs=["lb"],
                seconds=kw.pop("seconds", 60), no_control=True, **kw)


def _copy_result(root) -> None:
    (root / "more").mkdir()
    (root / "more" / "copy.json").write_text((root / RESULT).read_text().replace('"base', '"copy'))


def known_result_finding(damage: S.Damage) -> str | None:
    """The issue-22 finding a damaged result hits, or None."""
    value = damage.value
    if S.has_control(value):
        return "low: report prints ANSI/OSC escapes from a result"
    if "training_log" in damage.label and isinstance(value, str):
        return "15: training_log read whole, from anywhere"
    numbers = [v for v in (value if isinstance(value, list) else [value])
               if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if any(isinstance(v, float) and not math.isfinite(v) for v in numbers):
        return "low: NaN/inf values in results"
    return None


@pytest.fixture(scope="session")
def result_paths(world_dir):
    return _result_paths(world_dir)


# --------------------------------------------------------------------------- report

@harness_settings(16)
@given(data=st.data(), html=st.booleans())
def test_report_bad_values(check, result_paths, data, html):
    damage = data.draw(S.json_damage(RESULT, result_paths).filter(lambda d: known_result_finding(d) is None))
    check(_report(damage, [] if html else ["--no-html"]), [damage])


@harness_settings(8)
@given(damage=st.one_of(S.whole_json_damage(RESULT, deep=False), S.byte_damage(RESULT)))
def test_report_damaged_document(check, damage):
    check(_report(damage), [damage])


REPORT_FLAGS = {"--k-max": S.flag_ints.filter(lambda v: v < 10**4), "--html": st.sampled_from(["out/x.html", "out/"]),
                "--training-log": st.sampled_from(["runs/base/metrics.jsonl", "nope.jsonl", "recipe.yaml", "target"])}


@harness_settings(4)
@given(extra=st.sampled_from(sorted(REPORT_FLAGS)).flatmap(lambda f: REPORT_FLAGS[f].map(lambda v: [f, str(v)])))
def test_report_bad_flags(check, extra):
    case = _report(None, extra, names=[extra[0], extra[1]])
    case.outputs = ["out", HTML]
    check(case)


KNOWN_REPORT = [("training_log", "../huge.jsonl", "15"),
                ("drafter.name", "\x1b]0;pwned\x07\x1b[2J", "low: ANSI/OSC escapes"),
                ("command", "\x1b[31mred", "low: ANSI/OSC escapes")]


@pytest.mark.parametrize("key, value, finding", KNOWN_REPORT, ids=[f"{k}={v!r}" for k, v, _ in KNOWN_REPORT])
def test_report_known_findings(check, key, value, finding):
    path = tuple(key.split("."))
    damage = S.Damage(f"{RESULT}: {key} = {value!r}", lambda root: _set_json(root / RESULT, path, value), [key])
    check(_report(damage, seconds=15), [S.Damage("a 4 GB sparse file beside the sandbox", _sparse_log, []), damage])


def _sparse_log(root) -> None:
    """A 4 GB sparse metrics file (issue 22: a 50 GB one gave a MemoryError), outside the result's folder."""
    with open(root / "huge.jsonl", "wb") as f:
        f.truncate(4 << 30)


@pytest.mark.parametrize("doc", S.DEEP_JSON, ids=["list", "object"])
def test_report_deeply_nested_result(check, doc):
    damage = S.Damage(f"{RESULT}: nested {doc[:5]!r}...", lambda root: (root / RESULT).write_text(doc), [])
    check(_report(damage), [damage])


def test_report_html_onto_the_result(check):
    case = _report(None, ["--html", RESULT], names=["--html", RESULT], expect_error=True)
    case.outputs = []
    check(case)


def _set_json(path, where: tuple, value) -> None:
    data = json.loads(path.read_text())
    node = data
    for part in where[:-1]:
        node = node[part]
    node[where[-1]] = value
    path.write_text(json.dumps(data))


# --------------------------------------------------------------------------- leaderboard

@harness_settings(8)
@given(data=st.data())
def test_leaderboard_bad_values(check, result_paths, data):
    damage = data.draw(S.json_damage(RESULT, result_paths).filter(lambda d: known_result_finding(d) is None))
    check(_leaderboard(damage), [S.Damage("copy", _copy_result, []), damage])


@harness_settings(4)
@given(damage=st.one_of(S.whole_json_damage(RESULT, deep=False), S.byte_damage(RESULT)))
def test_leaderboard_damaged_document(check, damage):
    check(_leaderboard(damage), [S.Damage("copy", _copy_result, []), damage])


LEADERBOARD_FLAGS = {"--k-max": S.flag_ints.filter(lambda v: v < 10**4),
                     "--training-log": st.sampled_from(["runs/base/metrics.jsonl", "nope.jsonl", "recipe.yaml"]),
                     "--out": st.sampled_from(["lb", "lb/", "lb/a/b"])}


@harness_settings(3)
@given(extra=st.sampled_from(sorted(LEADERBOARD_FLAGS)).flatmap(
    lambda f: LEADERBOARD_FLAGS[f].map(lambda v: [f, str(v)])))
def test_leaderboard_bad_flags(check, extra):
    check(_leaderboard(None, extra, names=[extra[0], extra[1]]), [S.Damage("copy", _copy_result, [])])


@harness_settings(3)
@given(doc=st.one_of(st.sampled_from(["[]", "[1, 2]", "NaN", '{"batches": NaN}', "{"]), S.json_values.map(json.dumps)))
def test_leaderboard_bad_profile(check, doc):
    damage = S.Damage(f"prof.json = {doc[:60]!r}", lambda root: (root / "prof.json").write_text(doc), ["prof.json"])
    check(_leaderboard(damage, ["--profile", "prof.json"], names=["--profile"]), [S.Damage("copy", _copy_result, []), damage])
