"""``Database``: one SQLite connection with the sidecar's pragmas, migrations and ``tx()``.

Both databases use it: the record store (``storage/store.py``, one engine thread) and alerting's
(``alerting/db.py``, shared by the engine, API and delivery threads, so ``threadsafe``).
BEGIN / COMMIT / ROLLBACK are written here and nowhere else.

Example::

    db = Database(":memory:", ("CREATE TABLE t (x INTEGER);",), threadsafe=True)
    with db.tx() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
    assert db.query("SELECT x FROM t")[0][0] == 1
    db.close()
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

RowFactory = type[sqlite3.Row] | None


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """BEGIN IMMEDIATE .. COMMIT on ``conn``, ROLLBACK on any error (a failed COMMIT too).

    IMMEDIATE takes the write lock up front, so a busy database fails here (after
    busy_timeout) rather than halfway through. ``Database.tx`` uses it; so does the chart
    history (ui/history.py), whose connection the indexer and the report bring themselves.
    """
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
    """

    def __init__(self, path: Path | str, migrations: Sequence[str], *, threadsafe: bool = False,
                 row_factory: RowFactory = None, busy_timeout_ms: int = 5000) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = row_factory
        self._lock: contextlib.AbstractContextManager[Any] = (
            threading.RLock() if threadsafe else contextlib.nullcontext())
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode is durable across process crashes (kill -9; not power loss):
        # the failure a sidecar meets. FULL would cost an fsync per transaction.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._migrate(migrations)

    def _migrate(self, migrations: Sequence[str]) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        for i, script in enumerate(migrations[version:], start=version + 1):
            self._conn.executescript(script)
            self._conn.execute(f"PRAGMA user_version = {i}")

    @contextlib.contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: everything inside commits together or not at all."""
        with self._lock, transaction(self._conn) as conn:
            yield conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        """One statement on its own (autocommit): a single write needs no ``tx``."""
        with self._lock:
            return self._conn.execute(sql, params)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """All rows of a read (``sqlite3.Row`` or tuples, per the row factory)."""
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def check_writable(self) -> None:
        """Raise sqlite3.Error unless a write transaction can commit now."""
        with self.tx() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS _probe (x)")
            conn.execute("INSERT INTO _probe VALUES (1)")
            conn.execute("DELETE FROM _probe")

    def close(self) -> None:
        with self._lock:
            self._conn.close()
