"""Robustness harness, issue 44 (trust, round 5): `draftsmith doctor` on generated engine command lines, dotted and
aliased flags included (tests/robustness/engine_commands.py), for each engine doctor reads, given as the user's
command and as a received export's serve_command. Each case runs in the sandbox (a forked child under a CPU-time
and memory budget): exit 0, 1 or 2, never a traceback, an exit-2 error naming a flag or the file, and no terminal
escape in the output.

Generated inputs in CI: 6 per engine and place (48 cases), a second or less each."""
from __future__ import annotations

import json
import shlex
import shutil
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.commands.doctor_exports import build_exports
from tests.robustness import sandbox
from tests.robustness.conftest import harness_settings
from tests.robustness.engine_commands import engine_line

ENGINES = {"vllm": ("eagle3", "vllm"), "sglang": ("dflash", "sglang"), "trtllm": ("eagle3", "trtllm"),
           "llama.cpp": ("eagle3", "llama.cpp")}
EXPORT = "exp"  # the export's directory inside each case's sandbox


@pytest.fixture(scope="module")
def doctor_case(tmp_path_factory):
    """run(engine, line, where) -> Outcome: a fresh sandbox holding the engine's export (its paths rewritten to the
    sandbox), doctor run on `line` as the user's command ("user") or with `line` as the export's own serve_command
    ("export"); fails with every broken promise."""
    import draftsmith.commands.doctor  # noqa: F401  (imported once: every forked case starts warm)
    import draftsmith.export.doctor.run  # noqa: F401

    built = build_exports(tmp_path_factory.mktemp("doctor-world"), list(ENGINES.values()))
    root = tmp_path_factory.mktemp("doctor-cases")
    counter = iter(range(10**6))

    def run(engine: str, line, where: str) -> sandbox.Outcome:
        box = root / f"case{next(counter):04d}"
        source = built[ENGINES[engine]]
        shutil.copytree(source, box / EXPORT)
        for name in ("draftsmith.json", "extra_llm_api_options.yaml"):
            path = box / EXPORT / name
            if path.exists():
                path.write_text(path.read_text().replace(str(source), str(box / EXPORT)))
        own = own_words(box / EXPORT)
        user = line.words
        if where == "export":
            side = json.loads((box / EXPORT / "draftsmith.json").read_text())
            side["serve_command"] = shlex.join(line.words)
            (box / EXPORT / "draftsmith.json").write_text(json.dumps(side))
            user = own
        case = sandbox.Case(["doctor", EXPORT, "--", *user], names=line.names, seconds=20, no_control=True,
                            label=line.label)
        before = sandbox.snapshot(box)
        outcome = sandbox.run(case, box)
        found = sandbox.violations(case, outcome, before, sandbox.snapshot(box))
        if found:
            raise AssertionError(f"draftsmith doctor ({engine}, {where}'s command)\n  input: {line.label}\n  words: "
                                 f"{[w[:80] for w in line.words]}\n  exit {outcome.code}\n  violations:\n    - "
                                 + "\n    - ".join(found) + f"\n  stderr tail: {outcome.stderr[-1500:]!r}\n"
                                 f"  stdout tail: {outcome.stdout[-800:]!r}")
        shutil.rmtree(box, ignore_errors=True)
        return outcome

    run.own = lambda engine: own_words(built[ENGINES[engine]])
    return run


def own_words(directory: Path) -> list[str]:
    command = json.loads((directory / "draftsmith.json").read_text())["serve_command"]
    return shlex.split([line for line in command.splitlines() if line.strip() and not line.startswith("#")][-1])


@pytest.mark.parametrize("where", ["user", "export"])
@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_engine_command_lines(doctor_case, engine, where):
    @harness_settings(6)
    @given(data=st.data())
    def case(data):
        line = data.draw(engine_line(doctor_case.own(engine), engine))
        doctor_case(engine, line, where)

    case()
