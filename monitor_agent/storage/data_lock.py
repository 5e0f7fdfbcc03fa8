"""``DataDirLock``: one sidecar per data directory, for the life of the process.

Two sidecars on one data directory both ingest, both run the detectors and both page: the
same NaN reaches on-call twice (19 of 30 runs in the hostile-input harness). SQLite's own
locks keep the files consistent, not the behaviour. So the sidecar holds an exclusive
``flock`` on ``<data_dir>/monitor-agent.lock`` from startup to exit, with its pid written
inside, and a second one refuses to start, naming that pid. The kernel drops the lock when
the process dies, even by SIGKILL: a stale lock file never blocks a restart.

A second holder is refused while the first holds it, and welcome once it let go::

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> first = DataDirLock(Path(tmp.name)).acquire()
    >>> try:
    ...     DataDirLock(Path(tmp.name)).acquire()
    ... except DataDirInUse as exc:
    ...     print(str(exc).split(";")[0].replace(tmp.name, "DIR").replace(str(os.getpid()), "PID"))
    data directory DIR is in use by another monitor-agent (pid PID)
    >>> first.release()
    >>> DataDirLock(Path(tmp.name)).acquire().release()
    >>> tmp.cleanup()
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
from pathlib import Path

from monitor_agent.storage.database import StorageError

log = logging.getLogger(__name__)

LOCK_NAME = "monitor-agent.lock"


class DataDirInUse(StorageError):
    """Another live process holds the data directory's lock; the message names its pid."""


class DataDirLock:
    """An exclusive, non-blocking ``flock`` on the data directory's lock file."""

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        """Take the lock, or raise ``DataDirInUse``. A directory where no lock file can be
        made (read-only, missing rights) is served unlocked with a warning: no second
        sidecar can write there either, and the app reports the storage as not ready."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as exc:
            log.warning("cannot create %s (%s); running without the data directory lock",
                        self.path, exc)
            return self
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise
            who = f"pid {holder}" if holder else "a process that wrote no pid"
            raise DataDirInUse(
                f"data directory {self.path.parent} is in use by another monitor-agent "
                f"({who}); stop it or give this one its own --data-dir") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock; the file stays, harmless
            self._fd = None


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None
