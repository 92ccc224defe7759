"""`draftsmith doctor`: check a user's serve command (or engine config) against what an export was trained and
written for, one line per mismatch: what the engine will do, what the drafter was trained for, the fix.

    report = diagnose("exported/vllm", ["vllm", "serve", "meta-llama/...", "--speculative-config", "{...}"])
    report = diagnose_config("exported/trtllm", "extra_llm_api_options.yaml")
    print("\n".join(report.lines())); sys.exit(report.exit_code)   # 1: a mismatch that changes acceptance/output

The contract is the export directory (doctor/contract.py) and the serve command `draftsmith export` printed and
validated for it: the user's command is read by the same engine reader as the export's (each engine's doctor.py,
declared by its Exporter: vllm/, sglang/, trtllm/, llamacpp/), and every field that changes what the draft computes is
compared. Flags no reader knows are listed as "not checked", never passed over.
"""
from __future__ import annotations

import importlib.metadata
from dataclasses import dataclass, field

from draftsmith.core.errors import UserError
from draftsmith.export import engine_versions
from draftsmith.export.doctor.args import Command, split_command
from draftsmith.export.doctor.contract import Contract, Finding, read_contract
from draftsmith.report.text_safe import plain_text

MAX_LINE = 1500  # characters of one printed line: a finding quotes a path, a model name or a serve command


def engine_readers() -> tuple:
    """The engine readers the registered formats declare (Exporter.doctor), each once, in format order."""
    from draftsmith.export import EXPORTERS

    readers = []
    for name in EXPORTERS.names():
        reader = EXPORTERS.get(name).doctor
        if reader is not None and reader not in readers:
            readers.append(reader)
    return tuple(readers)


@dataclass
class Report:
    engine: str
    findings: list[Finding] = field(default_factory=list)
    unchecked: list[str] = field(default_factory=list)

    @property
    def mismatches(self) -> list[Finding]:
        return [f for f in self.findings if f.changes_acceptance]

    @property
    def exit_code(self) -> int:
        return 1 if self.mismatches else 0

    def lines(self) -> list[str]:
        """One line per finding, the flags not checked, the verdict; terminal-safe: a received export's serve_command,
        verifier.serve_as or file names reach these lines, so escapes and control characters are removed and a
        newline cannot start a line of its own (report/text_safe.py), and each line is bounded."""
        out = [f.line(self.engine) for f in self.findings]
        if self.unchecked:
            out.append("not checked: " + ", ".join(dict.fromkeys(self.unchecked)))
        n = len(self.mismatches)
        out.append(f"doctor: {n} mismatch(es) that change acceptance or output" if n else
                   f"doctor: the {self.engine} command matches the export")
        return [safe_line(line) for line in out]


def safe_line(text: str) -> str:
    """`text` on one terminal-safe line of at most MAX_LINE characters."""
    line = " ".join(plain_text(text).split("\n")).replace("\t", " ")
    return line if len(line) <= MAX_LINE else line[:MAX_LINE] + f"... ({len(line) - MAX_LINE:,} more characters)"


def engine_of(command: Command, source: str):
    """The engine reader that recognises `command`'s program; one UserError line for any other program."""
    readers = engine_readers()
    for engine in readers:
        if engine.recognises(command.argv):
            return engine
    known = ", ".join(engine.PROGRAM for engine in readers)
    raise UserError(f"{source}: {command.argv[0][:80]!r} is not an engine doctor reads ({known}); pass the "
                    "engine's own serve command after `--`")


def installed_release(engine) -> str | None:
    """The engine's installed release on this machine (doctor is meant to run where the engine runs): the reader's
    own `installed_release()` where it has one (llama.cpp: the project's llama-server build), else the package's."""
    own = getattr(engine, "installed_release", None)
    if own is not None:
        return own()
    if engine.PACKAGE is None:
        return None
    try:
        return importlib.metadata.version(engine.PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return None


def normalised_release(contract: Contract, release: str | None) -> str | None:
    if release is None or not engine_versions.versions(contract.fmt):
        return release
    try:
        return engine_versions.resolve(contract.fmt, release)
    except UserError:
        return release


def diagnose(export_dir, command, engine_version: str | None = None) -> Report:
    """Check `command` (a string, or argv words) against the export in `export_dir`."""
    contract = read_contract(export_dir)
    return check_command(contract, split_command(command), engine_version)


def diagnose_config(export_dir, config_file, engine_version: str | None = None) -> Report:
    """Check an engine config file (for the export's engine) against the export in `export_dir`."""
    contract = read_contract(export_dir)
    engine = engine_of(split_command(contract.serve_command, "the export's serve command"), "the export's serve command")
    return check_command(contract, engine.config_command(config_file), engine_version)


def check_command(contract: Contract, command: Command, engine_version: str | None) -> Report:
    exported = split_command(contract.serve_command, f"{contract.export_dir}/draftsmith.json serve_command")
    want_engine = engine_of(exported, "the export's serve command")
    engine = engine_of(command, "the serve command")
    if engine is not want_engine:
        line = " ".join(contract.serve_command.split())
        return Report(engine.ENGINE, [Finding("engine", f"not load this export ({contract.fmt} format)",
                                              f"{want_engine.ENGINE}", f"serve it as printed at export: {line}")])
    release = normalised_release(contract, engine_version or installed_release(engine))
    got = engine.read(command, "the serve command")
    want = engine.expected(contract, exported)
    refused = getattr(want, "refused", None)
    if refused:  # the export's own command is one its engine would not start: a damaged or foreign sidecar
        raise UserError(f"{contract.export_dir}/draftsmith.json serve_command: {engine.ENGINE} would refuse it "
                        f"({refused[0][1]}); the file is damaged or not this draftsmith's: export again")
    findings, unchecked = engine.check(contract, got, want, release)
    return Report(engine.ENGINE, findings, unchecked)


def prediction(export_dir, command, engine_version: str | None = None) -> dict:
    """doctor's prediction for a command, as data (for a test that serves it and measures tau): whether it
    predicts lower acceptance or other output than the export's own command, and why, one entry per field."""
    report = diagnose(export_dir, command, engine_version)
    return {"engine": report.engine, "exit_code": report.exit_code,
            "predicts_lower_acceptance": bool(report.mismatches),
            "mismatches": [{"field": f.field, "engine_does": f.engine_does, "trained_for": f.trained_for, "fix": f.fix}
                           for f in report.mismatches],
            "lines": report.lines()}
