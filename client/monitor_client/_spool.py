"""A bounded, ordered, on-disk queue of encoded records (the client's safety net).

Records land here when the sidecar cannot take them (down, overloaded, answering 5xx) or
when the in-memory queue is full, and are replayed oldest first once it answers again.
The spool is a directory of append-only JSON Lines segments; a record leaves it only when
the sidecar acknowledged it (``ack``), so a crash between send and ack re-sends it, which
the sidecar's idempotency (run_id, rank, kind, step) makes harmless. Writes are flushed to
the OS on every append (they survive the process dying, not the machine losing power).

Two bounds keep it from piling up unseen: ``max_bytes`` (past it the OLDEST segments are
dropped, keeping their run, eval and end records, which are few and matter more than one
more step) and ``max_age`` (segments last written longer ago are dropped whole: nobody is
coming for them). ``trim()`` applies both and returns how many records went; the sender
logs it. Dropping the oldest, not the newest, because the newest say where the run is now.

Each run and rank has its own directory, named for the run id as the user spelled it
(``spool_directory``), so the run a spool belongs to is plain to see; it is made only when a
record first has to wait, and removed when a closing process leaves it empty, so healthy
runs leave nothing behind. A spool a process left behind is replayed by the next Monitor
with that run id and rank, or sent by hand with ``monitor-agent push-spool DIR``.

A spool is replayed with the next job's token, so it must hold only what this user's own
processes wrote: the directories are private (``private_directory``). A run's spool
directory is made mode 0700; one found must be a real directory (not a symlink) owned by
this user, and is narrowed to 0700. The directory that holds them (``spool_dir``, default
``$TMPDIR/monitor_client-spool``) is made 0700 too, and one found must be a real
directory of this user's or root's that no other user can write to, unless it is sticky
(``/tmp``: nobody can move another user's entries); it is never changed. Anything else
raises ``SpoolUnsafe`` and the client spools elsewhere, privately (``Monitor``), rather
than replay records anyone could have planted. Segments are made 0600 and must be this
user's regular files. (The sender sends only its own run's and rank's lines too,
_sender.py.)

Two records wait; the sidecar takes the first::

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> spool = Spool(tmp.name, max_bytes=64 << 20, max_age=24 * 3600)
    >>> spool.append([b'{"kind":"step","step":1}', b'{"kind":"step","step":2}'])  # none dropped
    0
    >>> spool.peek(100)          # oldest first, not yet removed
    [b'{"kind":"step","step":1}', b'{"kind":"step","step":2}']
    >>> spool.ack(1)             # the sidecar acknowledged the first
    >>> len(spool), spool.peek(100)
    (1, [b'{"kind":"step","step":2}'])
    >>> spool.close()
    >>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import stat
import threading
import time
from pathlib import Path
from typing import BinaryIO
from urllib.parse import quote

from monitor_client._errors import MonitorClientError

_SUFFIX = ".ndjson"
# File-name bytes most file systems allow (255), less room for "-r<rank>" and a hash.
_MAX_NAME = 200


def spool_directory(base: str | Path, run_id: str, rank: int) -> Path:
    """Where run ``run_id``'s rank ``rank`` spools: ``<base>/<run_id>-r<rank>``.

    The run id is kept as written; only what a file name cannot hold (``/``, a leading dot,
    control characters, ``%`` itself) is percent-encoded, and an id too long for a file
    name is cut and suffixed with its hash, so two runs never share a spool::

        >>> spool_directory("/tmp/spool", "gpt-exp-1", 0).name
        'gpt-exp-1-r0'
        >>> spool_directory("/tmp/spool", "team/gpt 7", 3).name
        'team%2Fgpt 7-r3'
        >>> spool_directory("/tmp/spool", "..", 0).name
        '%2E.-r0'
    """
    name = quote(str(run_id), safe=" -_.~+=,@()")
    if name.startswith("."):  # "." and ".." are not names; a hidden directory is not seen
        name = "%2E" + name[1:]
    if len(name.encode()) > _MAX_NAME:
        digest = hashlib.sha256(str(run_id).encode()).hexdigest()[:16]
        name = name.encode()[:_MAX_NAME - 17].decode("utf-8", "ignore") + "-" + digest
    return Path(base) / f"{name}-r{int(rank)}"


class SpoolUnsafe(MonitorClientError, OSError):
    """A spool directory or segment another user could have written: not used."""


def private_directory(path: str | Path, base: bool = False) -> Path:
    """``path`` as a directory only this user can use: made 0700 (parents as usual) when
    missing; an existing one must be a real directory owned by this user, and is narrowed
    to 0700. ``base``, a directory that holds spools (the user may have chosen it: it is
    never changed): this user's or root's, and writable by nobody else unless sticky (as
    ``/tmp`` is: nobody can move another user's entries). Raises ``SpoolUnsafe`` (an
    ``OSError``) otherwise."""
    path = Path(path)
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700, parents=True)
    found = os.lstat(path)
    if not stat.S_ISDIR(found.st_mode):  # a symlink, a file, a FIFO: not ours to fill
        raise SpoolUnsafe(f"spool directory {path} is not a directory of its own "
                          "(a symlink or a file)")
    uid = _uid()
    if uid is None:
        return path
    if base:
        if found.st_uid not in (uid, 0):
            raise SpoolUnsafe(f"spool directory {path} belongs to another user (uid "
                              f"{found.st_uid})")
        if found.st_mode & 0o022 and not found.st_mode & stat.S_ISVTX:
            raise SpoolUnsafe(f"spool directory {path} is writable by other users (mode "
                              f"{stat.S_IMODE(found.st_mode):o}, not sticky)")
        return path
    if found.st_uid != uid:
        raise SpoolUnsafe(f"spool directory {path} belongs to another user (uid "
                          f"{found.st_uid}): what it holds could be anyone's records")
    if stat.S_IMODE(found.st_mode) & 0o077:
        os.chmod(path, 0o700)
    return path


def _check_segment(path: Path) -> None:
    found = os.lstat(path)
    uid = _uid()
    if not stat.S_ISREG(found.st_mode) or (uid is not None and found.st_uid != uid):
        raise SpoolUnsafe(f"spool segment {path} is not a regular file of this user's: "
                          "its records could be anyone's")


def _uid() -> int | None:
    """This process's user id; None where there is none (Windows)."""
    return os.geteuid() if hasattr(os, "geteuid") else None


def is_essential(line: bytes) -> bool:
    """run/eval/end records are kept even when the spool is full (cheap prefix check)."""
    return b'"kind":"step"' not in line[:40]


class Spool:
    """Bounded on-disk FIFO of JSON lines; see the module docstring for the guarantees."""

    def __init__(self, directory: str | Path, max_bytes: int = 256 << 20,
                 segment_bytes: int | None = None, max_age: float | None = 7 * 86400.0) -> None:
        self.directory = Path(directory)  # made when a record first has to wait
        self.max_bytes = max_bytes
        self.max_age = max_age
        # Size is enforced a segment at a time: keep several segments under the bound.
        self.segment_bytes = segment_bytes or min(4 << 20, max(max_bytes // 8, 64))
        self.dropped = 0
        self._lock = threading.Lock()
        if os.path.lexists(self.directory):  # left by an earlier process: only if ours
            private_directory(self.directory)
        self._segments = sorted(self.directory.glob(f"*{_SUFFIX}"))
        for segment in self._segments:
            _check_segment(segment)
        self._head_offset = 0
        self._peeked: tuple[int, int] | None = None  # (lines, bytes) returned by peek
        self._bytes = sum(p.stat().st_size for p in self._segments)
        self._records = sum(_count_lines(p) for p in self._segments)
        self._writer: BinaryIO | None = None

    @property
    def pending_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return self._records

    def append(self, lines: list[bytes]) -> int:
        """Append records in order; return how many OLD records were dropped to make room."""
        with self._lock:
            for line in lines:
                self._write(line + b"\n")
            if self._writer is not None:
                self._writer.flush()
            return self._trim_locked()

    def trim(self) -> int:
        """Apply ``max_bytes`` and ``max_age``; return how many records were dropped."""
        with self._lock:
            return self._trim_locked()

    def _trim_locked(self) -> int:
        dropped = 0
        too_old = (time.time() - self.max_age) if self.max_age is not None else None
        # Each segment present now is looked at once: the run/eval/end lines moved to the
        # tail are not revisited, so a spool of only those cannot cycle.
        for _ in range(len(self._segments)):
            head = self._segments[0]
            if self._is_active(head):
                break
            if too_old is not None and head.stat().st_mtime < too_old:
                dropped += self._drop_head(keep_essential=False)
            elif self._bytes > self.max_bytes:
                dropped += self._drop_head(keep_essential=True)
            else:
                break
        self.dropped += dropped
        return dropped

    def _drop_head(self, keep_essential: bool) -> int:
        """Discard the oldest segment; run/eval/end lines move to the tail when asked."""
        lines, _ = self._read_head(1 << 30, 1 << 62)
        self._peeked = None  # a pending ack would now point at other records
        self._discard_head()
        kept = [line for line in lines if is_essential(line)] if keep_essential else []
        self._records -= len(lines)
        for line in kept:
            self._write(line + b"\n")
        if self._writer is not None:
            self._writer.flush()
        return len(lines) - len(kept)

    def _write(self, data: bytes) -> None:
        writer = self._writer
        if writer is None or writer.tell() >= self.segment_bytes:
            writer = self._open_new_segment()
        writer.write(data)
        self._bytes += len(data)
        self._records += 1

    def _open_new_segment(self) -> BinaryIO:
        if self._writer is not None:
            self._writer.close()
        private_directory(self.directory)
        last = int(self._segments[-1].stem) if self._segments else 0
        path = self.directory / f"{last + 1:012d}{_SUFFIX}"
        flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        self._writer = os.fdopen(os.open(path, flags, 0o600), "ab")
        self._segments.append(path)
        return self._writer

    def peek(self, max_records: int, max_bytes: int = 4 << 20) -> list[bytes]:
        """Up to ``max_records`` of the oldest records (at least one, however large)."""
        with self._lock:
            if not self._segments:
                return []
            if self._writer is not None:
                self._writer.flush()
            while self._segments:
                lines, size = self._read_head(max_records, max_bytes)
                if lines or self._is_active(self._segments[0]):
                    break
                self._discard_head()  # exhausted, or only a torn write from a crash is left
            else:
                lines, size = [], 0
            self._peeked = (len(lines), size)
            return lines

    def _is_active(self, path: Path) -> bool:
        return self._writer is not None and path == self._segments[-1]

    def _read_head(self, max_records: int, max_bytes: int) -> tuple[list[bytes], int]:
        lines: list[bytes] = []
        size = 0
        with self._segments[0].open("rb") as fh:
            fh.seek(self._head_offset)
            for raw in fh:
                if not raw.endswith(b"\n"):
                    break  # a torn write from a crashed process: never complete, skip it
                if lines and (len(lines) >= max_records or size + len(raw) > max_bytes):
                    break
                lines.append(raw[:-1])
                size += len(raw)
        return lines, size

    def ack(self, n: int) -> None:
        """Remove the first ``n`` records returned by the last ``peek``."""
        with self._lock:
            if self._peeked is None or n <= 0:
                return
            count, size = self._peeked
            if n != count:
                size = self._size_of_first(n)
            self._peeked = None
            self._head_offset += size
            self._bytes -= size
            self._records -= n
            self._drop_exhausted_head()

    def _size_of_first(self, n: int) -> int:
        return self._read_head(n, 1 << 62)[1]

    def _drop_exhausted_head(self) -> None:
        if self._head_offset >= self._segments[0].stat().st_size:
            self._discard_head()

    def _discard_head(self) -> None:
        head = self._segments[0]
        if self._is_active(head) and self._writer is not None:
            self._writer.close()
            self._writer = None
        self._bytes -= max(head.stat().st_size - self._head_offset, 0)
        head.unlink(missing_ok=True)
        self._segments.pop(0)
        self._head_offset = 0

    def close(self, remove_if_empty: bool = False) -> None:
        """Close the write handle; what is pending stays on disk for a later replay.

        ``remove_if_empty``: also remove the directory when nothing is pending (the owner
        of a per-run directory says so; only an empty directory is ever removed)."""
        with self._lock:
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            if remove_if_empty and not self._records:
                for segment in self._segments:  # exhausted, or a torn write's remains
                    segment.unlink(missing_ok=True)
                self._segments = []
                # not there, or something else in it: leave it be
                with contextlib.suppress(OSError):
                    self.directory.rmdir()


def _count_lines(path: Path) -> int:
    with path.open("rb") as fh:
        return sum(1 for line in fh if line.endswith(b"\n"))
