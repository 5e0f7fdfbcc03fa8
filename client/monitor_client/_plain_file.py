"""Reading a small file another process left (a rollback plan, a checkpoint's data file):
a regular file of bounded size, opened without following a symlink and without blocking.

The launcher and the relaunched process read ``monitor_rollback.json`` from the training
job's output directory, which other processes write. A plain ``open`` would follow a
symlink planted there and wait forever on a FIFO (an open for reading blocks until a writer
comes), and ``json.load`` would read a file of any size into memory. So the file is opened
``O_NOFOLLOW | O_NONBLOCK`` (a symlink fails, a FIFO opens at once), must be a regular file
by ``fstat`` of what was opened (not of the name, which could change in between), and is
refused past ``max_bytes`` before a byte is read. A plan is a few hundred bytes; with the
job's checkpoint chain (``_rollback.py``) a few hundred kB at most.

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with open(os.path.join(d, "plan.json"), "w") as f:
    ...     _ = f.write('{"id": 3}')
    >>> read_json(os.path.join(d, "plan.json"))
    {'id': 3}
    >>> os.symlink(os.path.join(d, "plan.json"), os.path.join(d, "link.json"))
    >>> read_json(os.path.join(d, "link.json"))
    Traceback (most recent call last):
    monitor_client._plain_file.Refused: ... is a symlink: not followed
    >>> os.mkfifo(os.path.join(d, "fifo.json"))
    >>> read_json(os.path.join(d, "fifo.json"))
    Traceback (most recent call last):
    monitor_client._plain_file.Refused: ... is not a regular file
    >>> import shutil; shutil.rmtree(d)
"""

from __future__ import annotations

import errno
import json
import os
import stat
from typing import Any

from monitor_client._errors import MonitorClientError

__all__ = ["MAX_BYTES", "Refused", "read_json"]

MAX_BYTES = 4 << 20
"""The largest file read: a plan with a full checkpoint chain (``CHAIN_MAX`` entries of at
most 4096 characters each) is about 1 MiB."""


class Refused(MonitorClientError, ValueError):
    """The file is there but is not one to read (a symlink, not a regular file, too big)."""


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_BYTES) -> Any:
    """The JSON value in ``path``. Raises ``FileNotFoundError`` (and other ``OSError``) when
    it cannot be opened, ``Refused`` when it is not a regular file of at most ``max_bytes``,
    ``ValueError`` when it is not JSON."""
    name = os.fspath(path)
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(name, flags)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Refused(f"{name} is a symlink: not followed") from None
        raise
    with os.fdopen(fd, "rb") as src:
        found = os.fstat(src.fileno())
        if not stat.S_ISREG(found.st_mode):
            raise Refused(f"{name} is not a regular file")
        if found.st_size > max_bytes:
            raise Refused(f"{name} holds {found.st_size} bytes, more than {max_bytes}")
        data = src.read(max_bytes + 1)  # it may have grown since the fstat
    if len(data) > max_bytes:
        raise Refused(f"{name} holds more than {max_bytes} bytes")
    return json.loads(data)
