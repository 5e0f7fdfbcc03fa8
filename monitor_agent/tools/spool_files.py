"""Which files ``push-spool`` may read and delete, found without following a link.

A spool directory is a place other processes write into (``$TMPDIR`` by default), so what
is in it is not trusted to be what the client left: a symbolic link where a run directory
was (``gpt-7-r0 -> /home/someone/project``), a FIFO or a device where a segment was, a
directory of someone's own NDJSON files. So:

- Only what the client writes is ever deleted: segment files named as
  ``client/monitor_client/_spool.py`` names them (``000000000001.ndjson``), in the named
  directory or one level below it. Other ``*.ndjson`` files are not a spool's; a file the
  user names by hand is pushed and kept unless it is named as a segment.
- No symbolic link is followed. The named path may not be one; below it, directories are
  opened relative to their parent with ``O_NOFOLLOW`` and checked to be the directory that
  was listed, and files are opened relative to that directory, so a link swapped in after
  the listing is refused, not followed. A link found in a listing is reported as skipped.
- Only regular files are read: a file is opened non-blocking (a FIFO cannot hang the
  open) and ``fstat``-ed before a byte is read; anything else is skipped.
- A file is deleted through the directory it was read from, and only while its name still
  names the file that was read.

A spool base with one run's segment, a link to a directory elsewhere, and a FIFO::

    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> base, elsewhere = Path(tmp.name, "spool"), Path(tmp.name, "elsewhere")
    >>> (base / "gpt-7-r0").mkdir(parents=True); elsewhere.mkdir()
    >>> _ = (base / "gpt-7-r0" / "000000000001.ndjson").write_text("{}\\n")
    >>> (base / "other-r0").symlink_to(elsewhere)
    >>> os.mkfifo(base / "gpt-7-r0" / "000000000002.ndjson")
    >>> listing = scan(base)
    >>> [(d.name, d.files) for d in listing.directories]
    [('gpt-7-r0', [('000000000001.ndjson', True)])]
    >>> [line.split(": ")[1] for line in listing.skipped]
    ['a symbolic link, not followed', 'a FIFO, not a regular file']
    >>> tmp.cleanup()
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from monitor_agent.tools import ToolError

SUFFIX = ".ndjson"
# As client/monitor_client/_spool.py names a segment (``_open_new_segment``).
SEGMENT_NAME = re.compile(r"[0-9]{12}\.ndjson")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
# Non-blocking: opening a FIFO for reading would otherwise wait for a writer, forever.
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class SpoolFileError(ToolError):
    """The named path cannot be pushed (missing, a link, not a file or directory, nothing
    in it); the message says why."""


@dataclass
class Directory:
    """A directory holding segments: the named one (``name`` None) or one below it."""

    name: str | None
    ident: tuple[int, int]  # (st_dev, st_ino) when listed: pushed only from that directory
    files: list[tuple[str, bool]] = field(default_factory=list)  # (name, deletable), in order


@dataclass
class Listing:
    """What ``scan`` found under a named path, to push in this order."""

    path: Path  # as the user named it
    top: Path  # the directory opened: ``path``, or the named file's directory
    top_named: bool  # ``top`` is what the user named (so it is no link, and opened as none)
    directories: list[Directory]
    skipped: list[str]  # "PATH: why", entries never read

    @property
    def file_count(self) -> int:
        return sum(len(d.files) for d in self.directories)


def scan(path: Path) -> Listing:
    """The segment files under ``path`` (a run's directory, the spool base, or one file),
    oldest first within each directory; raises SpoolFileError when there is nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise SpoolFileError(f"{path}: no such spool directory or file") from None
    except OSError as exc:
        raise SpoolFileError(f"{path}: {exc.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise SpoolFileError(f"{path} is a symbolic link; push-spool follows none (a link "
                             "in a spool may point anywhere): name what it points to")
    if stat.S_ISREG(st.st_mode):
        top = path.parent
        named = Directory(None, _ident(os.stat(top)),
                          [(path.name, bool(SEGMENT_NAME.fullmatch(path.name)))])
        return Listing(path, top, False, [named], [])
    if not stat.S_ISDIR(st.st_mode):
        raise SpoolFileError(f"{path} is {_kind(st.st_mode)}, not a spool directory or "
                             "segment file: nothing read")
    listing = Listing(path, path, True, [], [])
    foreign = 0
    with _open_top(listing) as top_fd:
        here = Directory(None, _ident(os.fstat(top_fd)))
        subdirs: list[str] = []
        foreign += _list(top_fd, path, here, listing.skipped, subdirs)
        if here.files:
            listing.directories.append(here)
        for name in sorted(subdirs):
            try:
                fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=top_fd)
            except OSError as exc:  # swapped for a link since listed, or unreadable
                listing.skipped.append(f"{path / name}: {exc.strerror}")
                continue
            try:
                sub = Directory(name, _ident(os.fstat(fd)))
                foreign += _list(fd, path / name, sub, listing.skipped, None)
            finally:
                os.close(fd)
            if sub.files:
                listing.directories.append(sub)
    if not listing.directories:
        if foreign:
            raise SpoolFileError(
                f"{path}: no spool segments here (the client names them 000000000001"
                f"{SUFFIX}); {foreign} other *{SUFFIX} file{'s' * (foreign != 1)} are not a "
                "spool's and are left alone: name one to push it (it is kept)")
        raise SpoolFileError(f"{path}: no spooled records (*{SUFFIX}) here")
    return listing


def _list(fd: int, where: Path, into: Directory, skipped: list[str],
          subdirs: list[str] | None) -> int:
    """Fill ``into`` with the segments in directory ``fd``; note what is skipped; collect
    subdirectories when asked. Returns how many other ``*.ndjson`` files were seen."""
    foreign = 0
    with os.scandir(fd) as entries:
        found = sorted(entries, key=lambda e: e.name)
    for entry in found:
        try:
            mode = entry.stat(follow_symlinks=False).st_mode
        except FileNotFoundError:  # gone since listed (a client replaying it, say)
            continue
        if stat.S_ISDIR(mode):
            if subdirs is not None:
                subdirs.append(entry.name)
        elif stat.S_ISLNK(mode):
            skipped.append(f"{where / entry.name}: a symbolic link, not followed")
        elif not entry.name.endswith(SUFFIX):
            continue
        elif not stat.S_ISREG(mode):
            skipped.append(f"{where / entry.name}: {_kind(mode)}, not a regular file")
        elif SEGMENT_NAME.fullmatch(entry.name):
            into.files.append((entry.name, True))
        else:
            foreign += 1
    return foreign


@contextlib.contextmanager
def open_directory(listing: Listing, directory: Directory) -> Iterator[tuple[int, int]]:
    """``(top_fd, dir_fd)`` of a listed directory, opened as listed (no link followed, the
    same inode), or SpoolFileError when it changed since."""
    with _open_top(listing) as top_fd:
        if directory.name is None:
            fd = os.dup(top_fd)
        else:
            try:
                fd = os.open(directory.name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=top_fd)
            except OSError as exc:
                raise SpoolFileError(f"{listing.top / directory.name}: {exc.strerror}") from None
        try:
            if _ident(os.fstat(fd)) != directory.ident:
                raise SpoolFileError(f"{_where(listing, directory)} was replaced since it "
                                     "was listed; not pushed")
            yield top_fd, fd
        finally:
            os.close(fd)


@contextlib.contextmanager
def open_segment(dir_fd: int, name: str) -> Iterator[tuple[BinaryIO, os.stat_result]]:
    """The file ``name`` in ``dir_fd`` for reading, if it is a regular file and no link;
    SpoolFileError otherwise (read nothing from it)."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:  # ELOOP: a link put there since the listing
        raise SpoolFileError(f"{name}: {exc.strerror}") from None
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise SpoolFileError(f"{name}: {_kind(st.st_mode)}, not a regular file")
    with os.fdopen(fd, "rb") as fh:
        yield fh, st


def delete_segment(dir_fd: int, name: str, read: os.stat_result) -> bool:
    """Delete ``name`` from ``dir_fd`` if it still is the file that was read."""
    try:
        now = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if _ident(now) != _ident(read):
            return False
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    return True


def remove_if_empty(listing: Listing, directory: Directory, top_fd: int) -> bool:
    """Remove a directory the push emptied; one holding anything else stays."""
    try:
        if directory.name is None:
            os.rmdir(listing.top)  # rmdir never follows a link, and removes only an empty one
        else:
            os.rmdir(directory.name, dir_fd=top_fd)
    except OSError:
        return False
    return True


@contextlib.contextmanager
def _open_top(listing: Listing) -> Iterator[int]:
    # What the user named was checked not to be a link: opened as none, so it stays so. A
    # named file's directory is the user's own path, followed as they wrote it.
    flags = _DIR_FLAGS | (os.O_NOFOLLOW if listing.top_named else 0)
    try:
        fd = os.open(listing.top, flags)
    except OSError as exc:
        raise SpoolFileError(f"{listing.top}: {exc.strerror}") from None
    try:
        yield fd
    finally:
        os.close(fd)


def _where(listing: Listing, directory: Directory) -> Path:
    return listing.top if directory.name is None else listing.top / directory.name


def _ident(st: os.stat_result) -> tuple[int, int]:
    return st.st_dev, st.st_ino


def _kind(mode: int) -> str:
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a directory"
    return "an unusual file"
