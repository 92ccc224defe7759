"""Run one `draftsmith` command in-process, in a forked child, under a CPU-time and memory limit,
and check the contract every command keeps (issue 22):

- exit status 0, 1 or 2 (never killed, never a crash code);
- no traceback in stdout or stderr (no `--debug` is ever passed here);
- exit 2 is an expected error: one line `draftsmith CMD: error: ...` (or a recipe's problem block,
  one line per problem) that names the file, key or flag the case damaged, and no longer than
  MAX_LINE characters;
- nothing written, changed or removed in the sandbox outside the paths the command owns (its
  --out, its output_dir, the HTML beside a report), and nothing left in TMPDIR;
- at most `seconds` of CPU time (RLIMIT_CPU: the kernel stops the child with SIGXCPU) and
  MEMORY_HEADROOM bytes of address space above what the process held at the fork.

Why CPU time, not wall clock (issue 34): on a busy machine a case waits for a core, and an honest
case was killed at a wall-clock budget. CPU time counts only the work the case itself did, so a
loaded machine does not change it. The wall clock is only a backstop for a case that blocks without
using the CPU (a read that never returns): WALL_FACTOR times the CPU budget, at least WALL_FLOOR s,
a margin that a machine 5x slower than an idle one passes.

Why a fork: the child inherits the already imported torch / transformers / draftsmith (an import
costs seconds; a fork costs milliseconds), and an address-space limit or a kill applies to the
child only. torch reserves about 1 GB of virtual memory at import, so the RLIMIT_AS limit is set
relative to the child's own VmSize at the fork, not as an absolute number.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re
import resource
import signal
import stat
import sys
import tempfile
import time
import traceback
from pathlib import Path

MEMORY_HEADROOM = 2 << 30  # bytes of address space a case may add; the tiny cases add well under 0.5 GB
MAX_LINE = 2000  # characters in one error line (a message that repeats a huge value is a finding)
MAX_OUTPUT = 200_000  # characters of stdout + stderr in one case
HASH_LIMIT = 64 << 20  # files larger than this are compared by size and mtime, not hashed
WALL_FACTOR = 10  # the wall-clock backstop: this many times a case's CPU budget ...
WALL_FLOOR = 120.0  # ... and at least this many seconds


@dataclasses.dataclass
class Case:
    """One generated command line: argv relative to the sandbox, and what its error must name."""
    argv: list[str]
    names: list[str]  # an exit-2 message must contain one of these (file name, key, flag)
    outputs: list[str] = dataclasses.field(default_factory=list)  # sandbox paths the command may write
    expect_error: bool = False  # exit 0 is itself a violation (the input is invalid)
    seconds: float = 60.0  # CPU seconds (user + system, all threads) the case may use
    label: str = ""  # what the generator damaged, for the report
    named_at: tuple[int, ...] = (2,)  # exit statuses whose message must name one of `names` (validate: 1 too)
    no_control: bool = False  # no terminal escape (ESC, BEL, CSI) may reach stdout/stderr (received text shown)


@dataclasses.dataclass
class Outcome:
    code: int | None  # exit status; None when killed
    stdout: str
    stderr: str
    seconds: float  # wall clock
    cpu_seconds: float  # user + system time of the child
    timed_out: bool  # stopped at its CPU budget (SIGXCPU) or at the wall-clock backstop
    wall_backstop: bool  # stopped at the wall-clock backstop (it blocked without using the CPU)
    signal: int | None
    max_rss_mb: float


def _digest(path: Path) -> str:
    if path.is_symlink():
        return "link:" + os.readlink(path)
    if path.is_dir():
        return "dir"
    mode = os.lstat(path).st_mode
    if not stat.S_ISREG(mode):  # a FIFO, socket or device node a case made: never opened (a FIFO would block)
        return f"special:{stat.S_IFMT(mode)}"
    if path.stat().st_size > HASH_LIMIT:  # a case's huge sparse file: size and mtime stand for its content
        return f"file:{path.stat().st_size}:{path.stat().st_mtime_ns}"
    h = hashlib.sha1()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return f"file:{path.stat().st_size}:{h.hexdigest()}"


def snapshot(root: Path) -> dict[str, str]:
    """relative path -> kind and content hash, for every entry under root (links not followed)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        for name in dirnames + filenames:
            p = Path(dirpath, name)
            found[p.relative_to(root).as_posix()] = _digest(p)
    return found


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    keys = set(before) | set(after)
    return sorted(k for k in keys if before.get(k) != after.get(k))


def _owned(path: str, outputs: list[str]) -> bool:
    """An output, a path inside one, or a folder on the way to one (made by mkdir -p)."""
    return any(path == o or path.startswith(o.rstrip("/") + "/") or o.startswith(path + "/") for o in outputs)


def cpu_limit(seconds: float) -> int:
    """RLIMIT_CPU's whole seconds for a budget (at least 1)."""
    return max(1, int(-(-seconds // 1)))


def wall_backstop(seconds: float) -> float:
    return max(WALL_FLOOR, WALL_FACTOR * seconds)


def _child(argv: list[str], sandbox: Path, out_file: Path, err_file: Path, cpu_seconds: float) -> None:
    """In the forked child: limits, redirected output, cwd and TMPDIR in the sandbox; never returns."""
    code = 1
    try:
        stdout = open(out_file, "w", buffering=1)
        stderr = open(err_file, "w", buffering=1)
        os.dup2(stdout.fileno(), 1)
        os.dup2(stderr.fileno(), 2)
        sys.stdout, sys.stderr = stdout, stderr
        vm = _vm_size()
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = vm + MEMORY_HEADROOM
        resource.setrlimit(resource.RLIMIT_AS, (limit if hard == resource.RLIM_INFINITY else min(limit, hard), hard))
        cpu = cpu_limit(cpu_seconds)  # a forked child's CPU time starts at 0; SIGXCPU at the soft limit
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
        os.chdir(sandbox)
        tmp = sandbox / "tmp"
        tmp.mkdir(exist_ok=True)
        os.environ.update({"TMPDIR": str(tmp), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                           "DRAFTSMITH_DEBUG": "0", "WANDB_MODE": "disabled"})
        tempfile.tempdir = str(tmp)
        import torch

        torch.set_num_threads(1)
        from draftsmith.cli import main

        try:
            code = main(list(argv))
        except SystemExit as exc:  # argparse errors, sys.exit in a command
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if isinstance(exc.code, str):
                print(exc.code, file=sys.stderr)
        except BaseException:  # what the real `draftsmith` would do with an unexpected exception
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code if isinstance(code, int) and 0 <= code < 256 else 1)


def _vm_size() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize in /proc/self/status")


def run(case: Case, sandbox: Path) -> Outcome:
    """Fork, run case.argv in the child under case.seconds of CPU time; SIGKILL at the wall-clock backstop."""
    io_dir = Path(tempfile.mkdtemp(prefix="harness-io-"))
    out_file, err_file = io_dir / "stdout", io_dir / "stderr"
    sys.stdout.flush()
    sys.stderr.flush()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:
        _child(case.argv, sandbox, out_file, err_file, case.seconds)
    backstop, status, usage = False, 0, None
    while True:
        done, status, usage = os.wait4(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() - start > wall_backstop(case.seconds):
            os.kill(pid, signal.SIGKILL)
            _, status, usage = os.wait4(pid, 0)
            backstop = True
            break
        time.sleep(0.01)
    seconds = time.monotonic() - start
    text = [p.read_text(errors="replace")[:MAX_OUTPUT] if p.exists() else "" for p in (out_file, err_file)]
    for p in (out_file, err_file):
        p.unlink(missing_ok=True)
    io_dir.rmdir()
    code = os.waitstatus_to_exitcode(status)
    sig = -code if code < 0 else None
    return Outcome(code=code if code >= 0 else None, stdout=text[0], stderr=text[1], seconds=seconds,
                   cpu_seconds=usage.ru_utime + usage.ru_stime, timed_out=backstop or sig == signal.SIGXCPU,
                   wall_backstop=backstop, signal=sig, max_rss_mb=usage.ru_maxrss / 1024)


_WARNING = re.compile(r"(Warning|warnings\.warn|^\s*warn\(|^\s*$)")
_PROBLEMS = re.compile(r"\d+ problem\(s\) in the recipe:$")


def error_lines(stderr: str) -> list[str]:
    """The error message of an exit-2 run: warnings and argparse's usage lines left out."""
    lines = [line for line in stderr.splitlines() if not _WARNING.search(line)]
    for i, line in enumerate(lines):
        if _PROBLEMS.search(line):  # config.ConfigError: a header naming the file, one line per problem
            return lines[i:]
    if lines and lines[0].startswith("usage:"):  # argparse: usage (wrapped over lines), then one error line
        return lines[-1:]
    return lines


def violations(case: Case, outcome: Outcome, before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Every way the outcome breaks the contract (empty: the case passed)."""
    found = []
    if outcome.wall_backstop:
        found.append(f"ran past the wall-clock backstop of {wall_backstop(case.seconds):g} s (killed; blocked "
                     f"after {outcome.cpu_seconds:.1f} CPU s?)")
    elif outcome.timed_out:
        found.append(f"used more than its {case.seconds:g} CPU-second budget (SIGXCPU)")
    elif outcome.signal is not None:
        found.append(f"killed by signal {outcome.signal} (memory limit or crash)")
    elif outcome.code not in (0, 1, 2):
        found.append(f"exit status {outcome.code}")
    if "Traceback (most recent call last)" in outcome.stdout + outcome.stderr:
        found.append("printed a traceback without --debug: " + _last_lines(outcome.stderr))
    if case.no_control and any(c in outcome.stdout + outcome.stderr for c in ("\x1b", "\x07", "\x9b")):
        found.append("printed a terminal escape sequence from a received file")
    if case.expect_error and outcome.code == 0:
        found.append("accepted an invalid input (exit 0)")
    if outcome.code == 2 and not outcome.timed_out:
        found.extend(_error_problems(case, error_lines(outcome.stderr)))
    elif outcome.code in case.named_at and case.names:  # e.g. validate's exit 1: the problems on stdout
        text = outcome.stdout + outcome.stderr
        if not any(name in text for name in case.names):
            found.append(f"exit {outcome.code} names none of {case.names}: {_last_lines(text)}")
    long = [len(line) for line in outcome.stderr.splitlines() if len(line) > MAX_LINE]
    if outcome.code != 0:
        long += [len(line) for line in outcome.stdout.splitlines() if len(line) > MAX_LINE]
    if long and outcome.code != 2:
        found.append(f"printed a line of {max(long):,} characters (unbounded message)")
    replaced = [p for p, d in before.items() if d.startswith("special:") and after.get(p) != d]
    if replaced:  # even an output: `--out /dev/null` must never turn a device node into a regular file
        found.append(f"replaced or removed a device node, FIFO or socket: {replaced[:8]}")
    written = [p for p in changes(before, after) if not _owned(p, case.outputs) and p != "tmp"]
    if written:
        found.append(f"wrote outside its outputs {case.outputs}: {written[:8]}")
    return found


def _error_problems(case: Case, lines: list[str]) -> list[str]:
    if not lines:
        return ["exit 2 with no error message"]
    problems = []
    long = [len(line) for line in lines if len(line) > MAX_LINE]
    if long:
        problems.append(f"an error line of {max(long):,} characters (unbounded message)")
    if not _PROBLEMS.search(lines[0]) and len(lines) != 1:
        problems.append(f"an expected error of {len(lines)} lines, not one: {_last_lines(chr(10).join(lines))}")
    text = "\n".join(lines)
    if case.names and not any(name in text for name in case.names):
        problems.append(f"the error names none of {case.names}: {text[:300]!r}")
    return problems


def _last_lines(text: str, n: int = 3) -> str:
    return " | ".join(line.strip()[:200] for line in text.strip().splitlines()[-n:])
