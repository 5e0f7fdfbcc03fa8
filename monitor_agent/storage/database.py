"""``Database``: one SQLite connection with the sidecar's pragmas, migrations and ``tx()``;
``StorageError``, the one error type of the stores, and ``storage_errors``, which makes one.

Every database uses it: the record store (``storage/store.py``, one engine thread), alerting's
(``alerting/db.py``, shared by the engine, API and delivery threads, so ``threadsafe``) and
the chart history (``history/schema.py``: its indexer thread writes, each chart request reads
on a ``readonly`` one of its own). BEGIN / COMMIT / ROLLBACK are written here and nowhere
else.

The storage boundary: no ``sqlite3.Error`` leaves a store. ``Database`` turns every one into
a ``StorageError`` (the SQLite error chained as its ``__cause__``), and so does a ``tx()`` for
whatever its body executes (``AlertTx``, ``Outbox.enqueue``, the history's aggregates); a
store that reads rows after the call (a cursor's ``fetchmany``) wraps that in
``storage_errors``. Callers catch ``StorageError``.

A transaction whose second statement fails commits nothing, and says so as a
``StorageError``::

    >>> db = Database(":memory:", ("CREATE TABLE t (x INTEGER);",), threadsafe=True)
    >>> with db.tx() as conn:
    ...     _ = conn.execute("INSERT INTO t VALUES (1)")
    >>> with db.tx() as conn:
    ...     _ = conn.execute("INSERT INTO t VALUES (2)")
    ...     _ = conn.execute("INSERT INTO nowhere VALUES (3)")
    Traceback (most recent call last):
    ...
    monitor_agent.storage.database.StorageError: no such table: nowhere
    >>> db.query("SELECT x FROM t")
    [(1,)]
    >>> db.close()
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeAlias
from urllib.parse import quote

from monitor_agent.errors import MonitorAgentError

Connection: TypeAlias = sqlite3.Connection
"""The connection a ``Database.tx()`` hands its body: a store's SQL inside one transaction
(``AlertTx``, ``Outbox.enqueue``, the chart history's aggregates) runs on it."""

Row: TypeAlias = sqlite3.Row
"""A row read by column name (``row["run_id"]``): pass it as ``row_factory``."""

RowFactory = type[Row] | None


def read_only_uri(path: Path | str) -> str:
    """The SQLite URI that opens ``path`` read-only (``sqlite3.connect(uri, uri=True)``).

    The path is percent-quoted: SQLite would read a ``?`` or ``#`` in a directory name as
    the URI's query or fragment, and a ``%`` as an escape, and so open another file.

        >>> read_only_uri("/data/run #3?/monitor.sqlite")
        'file:///data/run%20%233%3F/monitor.sqlite?mode=ro'
    """
    return f"file://{quote(str(Path(path).absolute()))}?mode=ro"


class StorageError(MonitorAgentError, RuntimeError):
    """The store could not do that now: disk full, read-only, locked, corrupt, I/O.

    The one error type above the storage boundary; the SQLite error, if one caused it, is
    its ``__cause__``. ``source`` names the database the way readiness reports it:
    "storage" (the records) unless its ``Database`` was opened with another (alerting's:
    "alert storage"). ``corrupt`` is True when SQLite found the file damaged or not a
    database at all (SQLITE_CORRUPT, SQLITE_NOTADB): unlike a full disk or a lock, that
    does not pass by waiting.
    """

    def __init__(self, message: str, *, source: str = "storage", corrupt: bool = False) -> None:
        super().__init__(message)
        self.source = source
        self.corrupt = corrupt


class UnstorableValue(MonitorAgentError, ValueError):
    """A value handed to the store that SQLite cannot bind (a list where a column wants
    text, an integer past 64 bits). The edge's checks keep every such value out
    (records/limits.py); one that gets past them is a bug above the store, not the store
    failing: it must not make the sidecar not ready, nor refuse every other client."""


_CORRUPT_CODES = (11, 26)  # SQLITE_CORRUPT, SQLITE_NOTADB (primary codes: the low byte)


def is_corrupt(exc: sqlite3.Error) -> bool:
    """Whether SQLite says the database file itself is damaged."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in _CORRUPT_CODES
    return "malformed" in str(exc) or "not a database" in str(exc)


class _StorageErrors(contextlib.ContextDecorator):
    """See ``storage_errors``; a class (not a generator) so a guarded call costs little."""

    def __init__(self, doing: str | None, source: str) -> None:
        self.doing, self.source = doing, source

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, sqlite3.InterfaceError):  # binding a value it cannot store
            message = f"{self.doing}: {exc}" if self.doing else str(exc)
            raise UnstorableValue(message) from exc
        if isinstance(exc, sqlite3.Error):
            message = f"{self.doing}: {exc}" if self.doing else str(exc)
            raise StorageError(message, source=self.source, corrupt=is_corrupt(exc)) from exc
        if isinstance(exc, StorageError) and self.doing:
            # Context for a failure from below; the cause stays the SQLite error.
            raise StorageError(f"{self.doing}: {exc}", source=exc.source,
                               corrupt=exc.corrupt) from (exc.__cause__ or exc)


def storage_errors(doing: str | None = None, *, source: str = "storage") -> _StorageErrors:
    """Around a block (``with``) or a function (a decorator): a ``sqlite3.Error`` raised
    inside leaves as ``StorageError``, its message kept and it chained as the cause.

    ``doing`` prefixes the message, of a ``StorageError`` from below too: "cannot store
    records: database or disk is full". Anything else passes through untouched.
    """
    return _StorageErrors(doing, source)


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, *,
                source: str = "storage") -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE .. COMMIT on ``conn``, ROLLBACK on any error (a failed COMMIT too);
    a SQLite error, in the body or the COMMIT, leaves as ``StorageError`` (``source``).

    IMMEDIATE takes the write lock up front, so a busy database fails here (after
    busy_timeout) rather than halfway through. ``Database.tx`` uses it.
    """
    with storage_errors(source=source):
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


class Database:
    """A SQLite connection in autocommit mode; writes that belong together go in ``tx()``.

    ``threadsafe`` guards every use with one re-entrant lock (a ``tx`` may call ``query``);
    without it the caller promises a single thread and pays for no lock.
    ``migrations[i]`` upgrades the schema from ``PRAGMA user_version`` i to i + 1.
    ``readonly`` opens an existing file for reads only (``read_only_uri``), unmigrated.
    Every method raises ``StorageError`` (with ``source``), never ``sqlite3.Error``.
    """

    def __init__(self, path: Path | str, migrations: Sequence[str], *, threadsafe: bool = False,
                 row_factory: RowFactory = None, busy_timeout_ms: int = 5000,
                 source: str = "storage", readonly: bool = False) -> None:
        self.path = str(path)
        self._source = source
        self._readonly = readonly
        self._errors = storage_errors(source=source)
        if self.path != ":memory:" and not readonly:
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a read-only or missing data directory
                raise StorageError(str(exc), source=source) from exc
        with self._errors:  # a corrupt file, an unreadable one, a full disk at migration
            if readonly:
                # A reader beside the process that writes the file: it neither changes the
                # journal mode nor migrates (the writer does both), and a missing file is
                # an error here rather than a new empty database.
                self._conn = sqlite3.connect(read_only_uri(self.path), uri=True,
                                             isolation_level=None, check_same_thread=False)
            else:
                self._conn = sqlite3.connect(self.path, isolation_level=None,
                                             check_same_thread=False)
            self._conn.row_factory = row_factory
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            if not readonly:
                self._conn.execute("PRAGMA journal_mode = WAL")
                # NORMAL in WAL mode is durable across process crashes (kill -9; not power
                # loss): the failure a sidecar meets. FULL would cost an fsync per
                # transaction.
                self._conn.execute("PRAGMA synchronous = NORMAL")
                self._migrate(migrations)
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if threadsafe else contextlib.nullcontext())

    def _migrate(self, migrations: Sequence[str]) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        for i, script in enumerate(migrations[version:], start=version + 1):
            # One transaction with its version bump: a migration that rebuilds a table and
            # is killed halfway leaves the old schema, and runs again whole at the next start.
            try:
                self._conn.executescript(
                    f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {i};\nCOMMIT;")
            except BaseException:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything inside commits together or not at all.

        A SQLite error of the body's statements (or of the COMMIT) rolls back and leaves
        the ``with`` as ``StorageError``: the body's SQL is behind the boundary too.
        """
        with self._lock, transaction(self._conn, source=self._source) as conn:
            yield conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """One statement on its own (autocommit): a single write needs no ``tx``."""
        with self._lock, self._errors:
            return self._conn.execute(sql, params)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """All rows of a read (``sqlite3.Row`` or tuples, per the row factory)."""
        with self._lock, self._errors:
            return self._conn.execute(sql, params).fetchall()

    def check_writable(self) -> None:
        """Raise StorageError unless a write transaction can commit now."""
        with self.tx() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS _probe (x)")
            conn.execute("INSERT INTO _probe VALUES (1)")
            conn.execute("DELETE FROM _probe")

    def check_integrity(self) -> None:
        """Raise ``StorageError`` (``corrupt``) unless SQLite's ``quick_check`` passes: every
        page and index entry readable, without the full cross-check of ``integrity_check``.
        The app runs it once at startup, so a damaged file is reported before it is
        served (it walks the whole file: 0.2 to 0.6 s per GiB with a warm page cache,
        bench/state_checks.py)."""
        with self._lock, self._errors:
            found = [row[0] for row in self._conn.execute("PRAGMA quick_check(5)")]
        if found != ["ok"]:
            raise StorageError(f"database disk image is malformed: {'; '.join(found)}",
                               source=self._source, corrupt=True)

    def close(self) -> None:
        """Checkpoint the WAL into the database file (TRUNCATE) and close: after a clean
        stop the ``.sqlite`` file alone holds everything, so copying it is a backup. A
        read-only one just closes: the WAL is its writer's to empty."""
        with self._lock, self._errors:
            if not self._readonly:
                checkpoint(self._conn)
            self._conn.close()


def checkpoint(conn: sqlite3.Connection) -> None:
    """Move the WAL's pages into the database and empty the WAL file (best effort: a
    reader still open elsewhere may keep part of it; SQLite finishes the job later)."""
    with contextlib.suppress(sqlite3.Error):  # closing still works; the next open replays it
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
