"""One training per output directory at a time: an exclusive fcntl lock on OUTPUT_DIR/.draftsmith.lock,
held from the start of a run to its end (the kernel drops it when the process dies, so a crashed run
never leaves the directory locked). A second training into the same directory exits at once
(status 2) naming the directory and the process that holds it.

    lock = RunLock.acquire(Path("runs/x"))   # raises RunDirBusyError (a UserError)
    ...
    lock.release()

The lock file stays in the directory (deleting it would let two runs lock two different files).
"""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from draftsmith.core.errors import UserError

LOCK_FILE = ".draftsmith.lock"


class RunDirBusyError(UserError):
    """Another training holds the output directory."""


class RunLock:
    def __init__(self, path: Path, handle):
        self.path, self._handle = path, handle

    @classmethod
    def acquire(cls, output_dir: Path) -> "RunLock":
        output_dir = Path(output_dir)
        output_dir.mkdir(parents=True, exist_ok=True)
        path = output_dir / LOCK_FILE
        handle = open(path, "a+", encoding="utf-8")
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip()[:40] or "another process"
            handle.close()
            raise RunDirBusyError(
                f"train.output_dir {output_dir} is in use by another training ({holder}); wait for it to end, "
                "or set train.output_dir to another directory") from None
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}\n")
        handle.flush()
        return cls(path, handle)

    def release(self) -> None:
        if self._handle is not None and not self._handle.closed:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
        self._handle = None
