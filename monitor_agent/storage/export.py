"""``monitor-agent export``: a stored run back into a trace file that ``replay`` accepts.

From the data directory (a read-only SQLite connection: safe beside a running sidecar) or
from a running sidecar's API (paged through ``/v1/runs/{id}/records``). Records come out
in the order the store keeps them (step, then run/step/eval/end, then rank), one JSON line
each, non-finite numbers spelled as docs/format.md says, attempt tokens as reads show them
(a digest: a trace file is handed around, a token is a write capability: records/tokens.py).

The file is written whole or not at all (a temporary file beside it, renamed at the end):
a mistyped run id, an unreachable sidecar or a full disk leave an existing file as it was.
A target inside the data directory, any SQLite database, or anything but a regular file (a
device node, a FIFO, a socket, a symbolic link: the rename would replace it) is refused
before anything is read, and every failure is an ``ExportError`` that says what to fix.

A data directory with two steps of one run (stored out of order), exported, then a
mistyped run id that leaves the file alone::

    >>> import tempfile
    >>> from monitor_agent.storage.store import RecordRow, Store
    >>> rows = [RecordRow("gpt-7", 0, "step", s, None, wire.dumps(
    ...     {"kind": "step", "run_id": "gpt-7", "step": s, "loss": float("nan")})) for s in (2, 1)]
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     data, out = Path(tmp, "data"), Path(tmp, "gpt-7.jsonl.gz")
    ...     data.mkdir()
    ...     store = Store(data / "monitor.sqlite")
    ...     _ = store.insert_records(rows)
    ...     store.close()
    ...     count = export_from_data_dir(data, "gpt-7", out)
    ...     try:
    ...         export_from_data_dir(data, "gtp-7", out)
    ...     except ExportError as exc:
    ...         print(str(exc).split(" in ")[0])
    ...     text = gzip.decompress(out.read_bytes()).decode()
    no records of run 'gtp-7'
    >>> count, text.splitlines()
    (2, ['{"kind":"step","run_id":"gpt-7","step":1,"loss":"NaN"}',
         '{"kind":"step","run_id":"gpt-7","step":2,"loss":"NaN"}'])
"""

from __future__ import annotations

import gzip
import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any
from urllib.parse import quote

import httpx

from monitor_agent.records import tokens, wire
from monitor_agent.storage.database import StorageError, read_only_uri

PAGE = 10_000  # the records endpoint's largest page
SQLITE_MAGIC = b"SQLite format 3\x00"


class ExportError(StorageError):
    """The run cannot be exported (unknown run, unreachable sidecar, refused token)."""


def export_from_data_dir(data_dir: Path, run_id: str, out: Path) -> int:
    db_path = data_dir / "monitor.sqlite"
    if not db_path.is_file():
        raise ExportError(f"no database at {db_path}")
    if out.absolute().resolve().is_relative_to(data_dir.absolute().resolve()):
        raise ExportError(f"{out} is inside the data directory {data_dir}: the sidecar's "
                          "files live there; write the trace somewhere else")
    db = sqlite3.connect(read_only_uri(db_path), uri=True)
    try:
        # The run's current history, as the records API answers it (pipeline/attempts.py);
        # a database no sidecar with attempts opened yet has nothing replaced.
        current = (" AND superseded_by IS NULL"
                   if db.execute("PRAGMA user_version").fetchone()[0] >= 2 else "")
        rows = db.execute(
            f"SELECT body FROM records WHERE run_id = ?{current} ORDER BY step, CASE kind "
            "WHEN 'run' THEN 0 WHEN 'step' THEN 1 WHEN 'eval' THEN 2 ELSE 3 END, rank",
            (run_id,))
        # Either route writes the same file: attempt tokens as the API shows them.
        count = _write(out, (tokens.redact_obj(wire.loads(body)) for (body,) in rows))
    finally:
        db.close()
    if count == 0:
        raise ExportError(f"no records of run {run_id!r} in {db_path}")
    return count


def export_from_url(url: str, run_id: str, out: Path, token: str | None = None) -> int:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60) as client:
        count = _write(out, _pages(client, run_id))
    if count == 0:
        raise ExportError(f"no records of run {run_id!r} at {url}")
    return count


def _pages(client: httpx.Client, run_id: str) -> Iterator[dict[str, Any]]:
    """Every record once, following each page's ``next`` link until it is null."""
    path: str | None = f"/v1/runs/{quote(run_id, safe='')}/records"
    params: dict[str, Any] | None = {"since_step": -1, "limit": PAGE}
    while path is not None:
        try:
            res = client.get(path, params=params)
        except httpx.HTTPError as exc:
            raise ExportError(f"cannot reach {client.base_url}: {exc}") from exc
        if res.status_code != 200:
            raise ExportError(f"{res.request.url} answered {res.status_code}: {res.text[:300]}")
        page = res.json()
        yield from page["records"]
        path, params = page.get("next"), None  # the link carries its query


def _write(out: Path, records: Iterable[dict[str, Any]]) -> int:
    """Write the records to ``out`` all or nothing: into a temporary file beside it, renamed
    over ``out`` only once every record is written. A failure (the run unknown, the sidecar
    gone, the disk full) leaves an existing ``out`` as it was, and no partial file."""
    _check_target(out)
    try:
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent)
    except OSError as exc:
        raise ExportError(f"cannot write into {out.parent}: {exc.strerror}") from None
    tmp = Path(name)
    count = 0
    try:
        with os.fdopen(fd, "wb") as raw:
            sink: IO[bytes] = raw
            if out.name.endswith(".gz"):
                sink = gzip.GzipFile(fileobj=raw, mode="wb")  # type: ignore[assignment]
            with sink:
                for rec in records:
                    sink.write(wire.dumps(rec) + b"\n")
                    count += 1
        if count:
            # Again at the last moment: the export took a while, and something other than
            # a regular file may have been put there since the first look.
            _refuse_non_regular(out, _lstat(out))
            os.replace(tmp, out)
    except OSError as exc:
        raise ExportError(f"cannot write {out}: {exc.strerror or exc}") from None
    finally:
        tmp.unlink(missing_ok=True)
    return count


def _check_target(out: Path) -> None:
    """Refuse, before reading anything, a target that cannot or must not be written.

    Only a regular file is ever replaced: the rename at the end puts a new regular file in
    place of whatever has the name, so a device node (as root: a system device), a FIFO
    (which would also hang the check below), a socket or a symbolic link at ``out`` is
    refused, not replaced. Looked at with ``lstat``, never through a link."""
    st = _lstat(out)
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ExportError(f"{out} is a directory; name the trace file to write "
                          "(e.g. run.jsonl.gz)")
    _refuse_non_regular(out, st)
    if not out.parent.is_dir():
        raise ExportError(f"directory {out.parent} does not exist")
    if st is None:
        return
    try:  # no link followed, no wait for a writer: it was a regular file a moment ago
        fd = os.open(out, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return
    with os.fdopen(fd, "rb") as fh:
        _refuse_non_regular(out, os.fstat(fh.fileno()))  # swapped since the lstat
        head = fh.read(len(SQLITE_MAGIC))
    if head == SQLITE_MAGIC:
        raise ExportError(f"{out} is an SQLite database; refusing to overwrite it with a trace")


def _refuse_non_regular(out: Path, st: os.stat_result | None) -> None:
    if st is None or stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISLNK(st.st_mode):
        raise ExportError(f"{out} is a symbolic link; export replaces only a regular file: "
                          "name the file itself")
    kind = ("a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else
            "a FIFO" if stat.S_ISFIFO(st.st_mode) else
            "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
    raise ExportError(f"{out} is {kind}; export replaces only a regular file: name another")


def _lstat(out: Path) -> os.stat_result | None:
    try:
        return os.lstat(out)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ExportError(f"cannot look at {out}: {exc.strerror}") from None
