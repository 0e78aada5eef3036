"""One run per workdir: an exclusive `fcntl.flock` on `workdir/run.lock`, held for the run's life.

The kernel releases the lock when the holding process dies (kill -9 included), so a stale lock
file never blocks a later run: only a live holder does. The file records the holder's pid, host
and start time, which the refusal names. A lock is per open file description, so one process
holds it through one `WorkdirLock` object; `check_free` only probes (takes and drops it). The
descriptor is not inherited by child processes. `launch/study.py` holds its study directory the
same way through another file (`WorkdirLock(w, lock_name="study.lock", what="study")`).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from typing import Optional

LOCK_NAME = "run.lock"


class WorkdirBusy(RuntimeError):
    """Another live process holds the workdir's lock (the message names its pid and host)."""


def _holder(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            info = json.loads(f.read() or "{}")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["time"]))
        return f"pid {info['pid']} on host {info['host']} (started {started})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its pid is not recorded yet)"


class WorkdirLock:
    """`with WorkdirLock(workdir):` holds `workdir/run.lock` exclusively, or raises WorkdirBusy.

    Non-blocking: a second run on a live workdir is refused at once, naming the holder.
    lock_name: the lock file's name in workdir; what: the holder's kind, as the refusal names it
    ("wait for that run to end")."""

    def __init__(self, workdir: str, lock_name: str = LOCK_NAME, what: str = "run"):
        self.workdir = os.path.abspath(workdir)
        self.path = os.path.join(self.workdir, lock_name)
        self.what = what
        self._fd: Optional[int] = None

    def acquire(self) -> "WorkdirLock":
        if self._fd is not None:
            return self
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            os.close(fd)
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise WorkdirBusy(
                    f"workdir {self.workdir} is in use by {_holder(self.path)}: wait for that "
                    f"{self.what} to end or stop it, or use another --workdir") from None
            raise
        info = {"pid": os.getpid(), "host": socket.gethostname(), "time": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            os.close(self._fd)
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def __enter__(self) -> "WorkdirLock":
        return self.acquire()

    def __exit__(self, *exc) -> bool:
        self.release()
        return False


def check_free(workdir: str) -> None:
    """Raise WorkdirBusy if a live process holds `workdir`'s lock (nothing is created when the
    workdir or its lock file does not exist)."""
    if not os.path.exists(os.path.join(workdir, LOCK_NAME)):
        return
    lock = WorkdirLock(workdir)
    lock.acquire()
    lock.release()


def prepare(workdir: str) -> str:
    """Create `workdir` if needed and check that this process can write in it.

    Raises ValueError in one line when the path is a file, cannot be created, or is not
    writable (a read-only mount, no permission). Returns the absolute path."""
    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"--workdir {workdir} is a file, not a directory: give a directory "
                         f"(it is created if missing)")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"cannot create --workdir {workdir}: {e.strerror or e}") from None
    probe = os.path.join(path, f".write-probe-{os.getpid()}")
    try:
        with open(probe, "w", encoding="utf-8") as f:
            f.write("ok")
        os.remove(probe)
    except OSError as e:
        raise ValueError(f"--workdir {workdir} is not writable: {e.strerror or e}") from None
    return path
