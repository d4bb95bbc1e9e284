"""One writer at a time per sweep directory: `lock_sweep_dir` holds `driver.lock` in it (an
exclusive flock) for a sweep's driver or a push to MLflow, and refuses anyone else who tries,
naming the holder and what to do.

Two drivers in one directory would run the same trials twice and overwrite each other's files;
the kernel drops a flock when its process ends, however it ends, so a killed driver's directory
resumes at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from amdahl.errors import UserError
from amdahl.sweepdir.layout import LOCK_FILE, SweepDir

#: `lock_sweep_dir`'s `by` for a sweep's driver.
DRIVER = "sweep driver"
#: What a second driver is told when a driver holds the directory.
_DRIVER_ADVICE = (
    "two drivers in one directory would run the same trials twice, spoil each other's timings "
    "and overwrite each other's files. Wait for it to end, or stop it (Ctrl-C in its terminal, "
    "or `kill -INT <pid>` on its host) and resume then; or drop --resume to start a new sweep "
    "directory"
)


class DirLock:
    """A sweep directory held by this process (see `lock_sweep_dir`) until `release` (or the
    end of a `with` block)."""

    def __init__(self, path: Path, file: Any):
        self.path, self._file = path, file

    def release(self) -> None:
        self._file.close()  # closing the file drops the lock

    def __enter__(self) -> DirLock:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()


def lock_sweep_dir(sweep_dir: Path, by: str = DRIVER, advice: str = _DRIVER_ADVICE) -> DirLock:
    """Hold `sweep_dir` for this process: an exclusive flock on `driver.lock` inside it.

    Anyone else who tries (a `--resume` of a sweep that still runs, in another terminal or on
    another host of a shared filesystem; a push to MLflow) is refused with exit 2, naming the
    holder (`by`: what it is), its pid and host, and `advice` (what a second writer would spoil,
    and what to do). The kernel drops the lock when its process ends, however it ends (SIGKILL,
    OOM kill), so a killed driver's directory resumes at once; the file stays and names the
    last holder.
    """
    path = SweepDir(sweep_dir).lock
    try:
        file = open(path, "a+")  # noqa: SIM115 - stays open as long as the lock is held
    except OSError as e:
        raise UserError(
            f"{sweep_dir}: cannot create {LOCK_FILE} there ({e.strerror or e}); a sweep "
            "directory must be writable by the driver"
        ) from None
    try:
        fcntl.flock(file, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder, held_by = _lock_holder(file)
        file.close()
        message = f"{sweep_dir} is in use by another {held_by} ({holder}); {advice}"
        raise UserError(message) from None
    except OSError as e:
        file.close()
        raise UserError(
            f"{sweep_dir}: cannot lock {LOCK_FILE} ({e.strerror or e}); keep sweep "
            "directories on a filesystem with file locks (a local disk, or NFS with locking)"
        ) from None
    since = datetime.now(timezone.utc).isoformat(timespec="seconds")
    file.seek(0)
    file.truncate()
    record = {"pid": os.getpid(), "host": socket.gethostname(), "since": since, "by": by}
    file.write(json.dumps(record))
    file.flush()
    return DirLock(path, file)


def _lock_holder(file: Any) -> tuple[str, str]:
    """Who holds the lock and what it is, as its lock file says (the holder writes it just
    after locking; a file written before `by` was recorded names a driver)."""
    for _ in range(20):
        file.seek(0)
        try:
            holder = json.loads(file.read() or "null")
        except ValueError:
            holder = None
        if isinstance(holder, dict) and "pid" in holder:
            who = (
                f"pid {holder['pid']} on host {holder.get('host', '?')}, "
                f"running since {holder.get('since', '?')}"
            )
            return who, str(holder.get("by") or DRIVER)
        time.sleep(0.05)
    return f"pid and host not recorded in {file.name}", DRIVER
