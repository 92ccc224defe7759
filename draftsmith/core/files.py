"""Files received from others, read without surprises, and our own files written without loss.

Reading (checkpoints, exports, init_from sources: anything a user may have been sent):
  - a safetensors file's header is checked before anything is allocated: the 8-byte header length
    against the file size, the JSON header, each tensor's dtype, shape and byte range against the
    data actually present (a truncated file, garbage, or a header claiming a 10^13-element tensor
    is one line naming the file, never a SafetensorError traceback or a huge allocation);
  - a JSON sidecar (drafter.json, draftsmith.json) must be a JSON object: garbled or other JSON is
    one line naming the file.
  - every received file is read through `read_received_bytes` / `read_received_text`: it must be a
    regular file (a FIFO would hang the read, /dev/zero would grow it until MemoryError) no larger
    than a bound per kind of file, else one line naming it.
Writing:
  - a file the user names for output (eval/profile --out, report --html, leaderboard files,
    regenerate.output) must be missing or a regular file (`check_output_file`): a device node, FIFO
    or socket is refused, never replaced by a rename (as root, `--out /dev/null` replaced
    /dev/null) nor written through;
  - a full disk (ENOSPC, EDQUOT, EFBIG) while writing a directory is one line naming it (`disk_full_guard`);
  - temporary directories are named `.NAME.tmp-PID-XXXX` beside the destination, so that a later
    run can remove those of a killed run (`clean_stale_temps`: only that pattern, only a dead PID);
  - `terminate_cleanly()` turns SIGTERM into SystemExit, so the `finally` blocks that remove a
    temporary directory run on `kill PID` too (SIGKILL cannot be caught: the next run cleans up).
"""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import re
import shutil
import signal
import stat
import tempfile
import threading
from pathlib import Path

from draftsmith.core.errors import UserError

# Bytes per element of each safetensors dtype (the format's own names).
SAFETENSORS_DTYPES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "F8_E4M3": 1, "F8_E5M2": 1, "I64": 8, "I32": 4,
                      "I16": 2, "I8": 1, "U64": 8, "U32": 4, "U16": 2, "U8": 1, "BOOL": 1}
MAX_HEADER_BYTES = 100 * 2**20  # safetensors' own limit for the JSON header


MAX_JSON_BYTES = 16 * 2**20  # drafter.json, draftsmith.json, speedup_profile.json: a few KiB when written by us
MAX_YAML_BYTES = 2**20  # a recipe or a checkpoint's config.yaml: a few KiB when written by us
MAX_RESULT_BYTES = 64 * 2**20  # an eval results file: well under 1 MiB for hundreds of prompts


def file_kind(mode: int) -> str:
    """'a directory', 'a FIFO', ... for an st_mode (what a path is, in an error message)."""
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISREG, "a regular file")):
        if test(mode):
            return name
    return "not a regular file"


def refuse_special_file(path: str | Path, what: str) -> None:
    """A path that exists but is not a regular file (a FIFO, a device, a directory; a link is followed) is
    one line saying what it is; a missing path passes (the caller says "no such file")."""
    try:
        st = os.stat(path)
    except OSError:
        return
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} {path}: is {file_kind(st.st_mode)}, not a regular file; give the path of the file itself")


def read_received_bytes(path: str | Path, what: str, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a received file, which must be a regular file of at most `limit` bytes (a link to
    /dev/zero or a FIFO is one line naming the file, never a hang or a MemoryError)."""
    path = Path(path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait for a writer
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UserError(f"{path}: is {file_kind(st.st_mode)}, not a regular file; the {what} must be a plain "
                            "file: replace it with the real file")
        if st.st_size > limit:
            raise UserError(f"{path}: {st.st_size:,} bytes, more than the {limit:,} a {what} may hold; the file "
                            "is damaged or not draftsmith's")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(min(limit, st.st_size) + 1)  # not limit + 1: a large bound would allocate it up front
    finally:
        os.close(fd)
    if len(data) > limit:  # it grew while being read
        raise UserError(f"{path}: more than the {limit:,} bytes a {what} may hold; the file is damaged or not draftsmith's")
    return data


def read_received_text(path: str | Path, what: str, limit: int = MAX_JSON_BYTES) -> str:
    """read_received_bytes decoded as UTF-8; other bytes (UTF-16 too) are one line naming the file."""
    data = read_received_bytes(path, what, limit)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); the "
                        f"{what} is damaged: write it again as UTF-8") from None


def check_output_file(path: str | Path, what: str) -> Path:
    """A file the user names for output must be missing or a regular file (a link to one counts): a device
    node, FIFO, socket or directory is refused, so a rename never replaces it and no write goes through it."""
    path = Path(path)
    try:
        st = os.stat(path)  # follows a link: a link to /dev/null is refused as /dev/null is
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot be written ({exc.strerror}); name another path") from None
    if not stat.S_ISREG(st.st_mode):
        raise UserError(f"{what} {path}: is {file_kind(st.st_mode)}, not a regular file; draftsmith writes only a "
                        "new file or over a regular file: name another path")
    return path


def write_text_atomically(path: str | Path, text: str, what: str = "--out") -> Path:
    """Write `text` to a temporary file beside `path`, then rename it over `path` (checked with
    check_output_file first): a full disk or a kill leaves the previous file whole (the OSError propagates;
    wrap the call in disk_full_guard for a one-line message naming the file)."""
    path = check_output_file(path, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        check_output_file(path, what)  # still not a special file (it may have appeared meanwhile)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _bad(path: Path, why: str) -> UserError:
    return UserError(f"{path}: {why}; the file is damaged or not a safetensors file: write it again "
                     "(or ask its sender for an intact copy)")


def check_safetensors(path: str | Path, data: bytes | None = None) -> dict:
    """The header of a safetensors file, checked against the bytes on disk (or against `data`, the file's
    bytes already in memory, e.g. decompressed; `path` then only names it); raises UserError."""
    path = Path(path)
    if data is None:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # O_NONBLOCK: opening a FIFO does not wait for a writer
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):  # a FIFO hung eval and export; /dev/zero has no size to check
            os.close(fd)
            raise UserError(f"{path}: is {file_kind(st.st_mode)}, not a regular file; weights must be a plain "
                            "safetensors file: replace it with the real file")
        size, opened = st.st_size, os.fdopen(fd, "rb")
    else:
        size, opened = len(data), contextlib.nullcontext()
    with opened as f:
        head = f.read(8) if data is None else data[:8]
        if len(head) < 8:
            raise _bad(path, f"only {size} bytes (a safetensors file starts with an 8-byte header length)")
        n = int.from_bytes(head, "little")
        if n > min(MAX_HEADER_BYTES, size - 8):
            raise _bad(path, f"its header claims {n:,} bytes but the file holds {size:,}")
        raw = f.read(n) if data is None else data[8:8 + n]
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise _bad(path, "its header is not JSON") from None
    if not isinstance(header, dict):
        raise _bad(path, "its header is not a JSON object")
    data_bytes, covered = size - 8 - n, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        if not isinstance(entry, dict):
            raise _bad(path, f"tensor {name[:80]!r} has no dtype/shape/offsets entry")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in SAFETENSORS_DTYPES:
            raise _bad(path, f"tensor {name[:80]!r} has unknown dtype {str(dtype)[:20]!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise _bad(path, f"tensor {name[:80]!r} has shape {str(shape)[:80]} (non-negative integers expected)")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
                or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise _bad(path, f"tensor {name[:80]!r} has byte range {str(offsets)[:80]} outside the "
                             f"{data_bytes:,} data bytes present (truncated?)")
        want = math.prod(shape) * SAFETENSORS_DTYPES[dtype]
        if offsets[1] - offsets[0] != want:
            raise _bad(path, f"tensor {name[:80]!r} of shape {shape[:8]} {dtype} needs {want:,} bytes, "
                             f"its byte range holds {offsets[1] - offsets[0]:,}")
        covered += want
    if covered != data_bytes:
        raise _bad(path, f"its tensors cover {covered:,} of the {data_bytes:,} data bytes")
    return header


def load_safetensors(path: str | Path) -> dict:
    """load_file after check_safetensors: every problem of a received file is one line naming it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    check_safetensors(path)
    try:
        return load_file(str(path))
    except SafetensorError as exc:  # anything the header check did not foresee
        raise _bad(Path(path), str(exc)) from None


def read_json_object(path: str | Path, what: str) -> dict:
    """A JSON file that must hold one object (drafter.json, draftsmith.json); one line if not."""
    path = Path(path)
    try:
        data = json.loads(read_received_text(path, what))
    except RecursionError:
        raise UserError(f"{path}: nested too deeply to be a {what}; the file is damaged or not draftsmith's") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); the {what} is damaged: "
                        "write it again") from None
    except UserError:
        raise
    except ValueError as exc:  # an integer past Python's 4,300 digits ("Exceeds the limit ... integer string")
        raise UserError(f"{path}: holds a number Python will not read ({str(exc)[:60]}); the {what} is damaged: "
                        "write it again") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: holds a JSON {type(data).__name__}, not the object a {what} holds; "
                        "the file is damaged or not draftsmith's")
    return data


NO_ROOM = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # full disk, quota, the file size limit (ulimit -f)


def _no_room(exc: BaseException, where: Path) -> bool:
    """Whether a write failed for want of room. OSError carries errno; safetensors raises a
    SafetensorError whose text ends "(os error 28)"; torch.save raises a RuntimeError naming no errno
    (then: whether the device has under 1 MiB left)."""
    if isinstance(exc, OSError):
        return exc.errno in NO_ROOM
    text = str(exc)
    m = re.search(r"os error (\d+)", text)
    if m:
        return int(m.group(1)) in NO_ROOM
    if isinstance(exc, RuntimeError) and ("inline_container" in text or "PytorchStreamWriter" in text):
        try:
            return shutil.disk_usage(where if where.is_dir() else where.parent).free < 2**20
        except OSError:
            return False
    return False


@contextlib.contextmanager
def disk_full_guard(path: Path, what: str, probe: Path | None = None):
    """Re-raise a write that failed for want of room (ENOSPC, EDQUOT, EFBIG; from open/write, safetensors
    or torch.save) inside the block as one line naming `path`; `probe`: where the files are written."""
    from safetensors import SafetensorError

    try:
        yield
    except (OSError, SafetensorError, RuntimeError) as exc:
        if not _no_room(exc, Path(probe or path)):
            raise
        where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
        raise UserError(f"{path}: no space left on the device (or past the file size limit) while writing the "
                        f"{what}{where}; nothing already there was changed: free space or write elsewhere") from exc


# --------------------------------------------------------------------------- temporary directories


def temp_dir_beside(final_dir: Path) -> Path:
    """A new `.NAME.tmp-PID-XXXX` directory beside final_dir (the PID lets a later run tell a dead owner)."""
    return Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.tmp-{os.getpid()}-", dir=final_dir.parent))


def write_dir_atomically(final_dir: Path, fill, what: str, tmp: Path | None = None, marker: str | None = None,
                         into_existing=None) -> Path:
    """The one atomic-directory writer (checkpoints, exports, leaderboards): fill(tmp) writes the new files in a
    `.NAME.tmp-PID-XXXX` directory beside final_dir; then, when final_dir does not exist, one rename puts it in
    place. Over an existing final_dir, `into_existing(tmp, final_dir)` moves the files in itself (exports and
    leaderboards keep what else the user has there); without it the old directory is swapped out whole
    (checkpoints). If fill raises, nothing reaches final_dir and the temporary directory is removed.

    `marker` names a file written last inside tmp (a checkpoint's COMPLETE); `tmp` may name a directory other
    ranks already wrote into (checkpoint.save_collective). A full disk is one line naming final_dir and `what`."""
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    if tmp is None:
        tmp = temp_dir_beside(final_dir)  # a later run removes it if this one is killed (clean_stale_temps)
    try:
        with disk_full_guard(final_dir, what, probe=tmp):
            fill(tmp)
            if marker:
                (tmp / marker).write_text("ok\n")
            if not final_dir.exists():
                os.replace(tmp, final_dir)
            elif into_existing is not None:
                into_existing(tmp, final_dir)
            else:
                old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}")
                os.replace(final_dir, old)
                os.replace(tmp, final_dir)
                shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final_dir


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def clean_stale_temps(final_dir: Path) -> list[str]:
    """Remove `.NAME.tmp-PID-XXXX` directories beside final_dir whose PID is no longer running (left
    by a killed run); anything else is left alone. Returns the names removed."""
    final_dir = Path(final_dir)
    parent = final_dir.parent
    if not parent.is_dir():
        return []
    pattern = re.compile(rf"^\.{re.escape(final_dir.name)}\.tmp-(\d+)-[A-Za-z0-9_]+$")
    removed = []
    for p in parent.iterdir():
        m = pattern.match(p.name)
        if m and p.is_dir() and not p.is_symlink() and not _alive(int(m.group(1))):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p.name)
    return sorted(removed)


@contextlib.contextmanager
def terminate_cleanly():
    """Inside the block SIGTERM raises SystemExit(143), so `finally` clean-ups run (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
