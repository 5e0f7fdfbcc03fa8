"""``Database``: one SQLite connection with the sidecar's pragmas, migrations and ``tx()``;
``StorageError``, the one error type of the stores, and ``storage_errors``, which makes one.

Both databases use it: the record store (``storage/store.py``, one engine thread) and alerting's
(``alerting/db.py``, shared by the engine, API and delivery threads, so ``threadsafe``).
BEGIN / COMMIT / ROLLBACK are written here and nowhere else.

The storage boundary: no ``sqlite3.Error`` leaves a store. ``Database`` turns every one into
a ``StorageError`` (the SQLite error chained as its ``__cause__``), and so does a ``tx()`` for
whatever its body executes (``AlertTx``, ``Outbox.enqueue``); the chart history, which brings
its own connection, wraps its methods in ``storage_errors``. Callers catch ``StorageError``.

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
from typing import Any

RowFactory = type[sqlite3.Row] | None


class StorageError(RuntimeError):
    """The store could not do that now: disk full, read-only, locked, corrupt, I/O.

    The one error type above the storage boundary; the SQLite error, if one caused it, is
    its ``__cause__``. ``source`` names the database the way readiness reports it:
    "storage" (the records) unless its ``Database`` was opened with another (alerting's:
    "alert storage").
    """

    def __init__(self, message: str, *, source: str = "storage") -> None:
        super().__init__(message)
        self.source = source


class _StorageErrors(contextlib.ContextDecorator):
    """See ``storage_errors``; a class (not a generator) so a guarded call costs little."""

    def __init__(self, doing: str | None, source: str) -> None:
        self.doing, self.source = doing, source

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if isinstance(exc, sqlite3.Error):
            message = f"{self.doing}: {exc}" if self.doing else str(exc)
            raise StorageError(message, source=self.source) from exc
        if isinstance(exc, StorageError) and self.doing:
            # Context for a failure from below; the cause stays the SQLite error.
            raise StorageError(f"{self.doing}: {exc}", source=exc.source) from (
                exc.__cause__ or exc)


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
    busy_timeout) rather than halfway through. ``Database.tx`` uses it; so does the chart
    history (ui/history.py), whose connection the indexer and the report bring themselves.
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
    Every method raises ``StorageError`` (with ``source``), never ``sqlite3.Error``.
    """

    def __init__(self, path: Path | str, migrations: Sequence[str], *, threadsafe: bool = False,
                 row_factory: RowFactory = None, busy_timeout_ms: int = 5000,
                 source: str = "storage") -> None:
        self.path = str(path)
        self._source = source
        self._errors = storage_errors(source=source)
        if self.path != ":memory:":
            try:
                Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:  # a read-only or missing data directory
                raise StorageError(str(exc), source=source) from exc
        with self._errors:  # a corrupt file, an unreadable one, a full disk at migration
            self._conn = sqlite3.connect(self.path, isolation_level=None,
                                         check_same_thread=False)
            self._conn.row_factory = row_factory
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
            self._conn.execute("PRAGMA journal_mode = WAL")
            # NORMAL in WAL mode is durable across process crashes (kill -9; not power
            # loss): the failure a sidecar meets. FULL would cost an fsync per transaction.
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

    def close(self) -> None:
        with self._lock, self._errors:
            self._conn.close()
