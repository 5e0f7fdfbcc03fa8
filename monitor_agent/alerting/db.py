"""Alerting's own SQLite database: alert state, silences and the notification outbox.

Separate from the record store so alert durability never waits on record writes. One
connection guarded by a lock: the engine thread, the API threads and the delivery threads
all use it, each for a few short statements (":memory:" works too, for replay and tests).

Example::

    db = AlertDB("data/alerts.sqlite")
    with db.tx() as conn:
        conn.execute("UPDATE alerts SET state = 'resolved' WHERE fingerprint = ?", (fp,))
    rows = db.query("SELECT * FROM alerts WHERE state = ?", ("firing",))
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE alerts (
        fingerprint     TEXT PRIMARY KEY,
        run_id          TEXT NOT NULL,
        rule            TEXT NOT NULL,
        type            TEXT NOT NULL,
        severity        TEXT NOT NULL,
        layer           TEXT,
        rank            INTEGER,
        identity        TEXT NOT NULL,      -- JSON: fingerprint labels (layer, rank)
        project         TEXT,
        labels          TEXT NOT NULL,      -- JSON: the run's labels
        channels        TEXT NOT NULL,      -- JSON list, fixed when the episode began
        cooldown        REAL NOT NULL,
        repeat_interval REAL NOT NULL,
        resolve_after   REAL NOT NULL,
        state           TEXT NOT NULL,      -- pending | firing | resolved
        started_at      REAL NOT NULL,
        pending_since   REAL,
        last_seen       REAL NOT NULL,      -- time of the latest matching finding
        last_step       INTEGER,
        count           INTEGER NOT NULL,   -- findings in this episode
        notified        TEXT,               -- what people were last told: firing | resolved
        notified_at     REAL,               -- when the last firing/repeat message went out
        refreshed_at    REAL,               -- last re-send to channels that need it
        resolved_at     REAL,
        acked_at        REAL,
        acked_by        TEXT,
        dashboard_url   TEXT,
        finding         BLOB NOT NULL       -- the latest finding, JSON
    );
    CREATE INDEX alerts_state ON alerts (state);
    CREATE INDEX alerts_run ON alerts (run_id);
    CREATE TABLE silences (
        id         TEXT PRIMARY KEY,
        run_id     TEXT,
        type       TEXT,
        alertname  TEXT,
        layer      TEXT,
        comment    TEXT NOT NULL,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL,
        ends_at    REAL NOT NULL
    );
    CREATE TABLE outbox (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        channel    TEXT NOT NULL,
        body       BLOB NOT NULL,
        created_at REAL NOT NULL,
        attempts   INTEGER NOT NULL DEFAULT 0,
        next_at    REAL NOT NULL,
        state      TEXT NOT NULL DEFAULT 'pending',   -- pending | sent | failed
        last_error TEXT,
        done_at    REAL
    );
    CREATE INDEX outbox_pending ON outbox (channel, state, id);
    """,
    # Actions back to the trainer (alerting/actions.py); an alert remembers the one it took.
    """
    CREATE TABLE actions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL,
        action      TEXT NOT NULL,      -- stop | checkpoint
        rule        TEXT NOT NULL,
        type        TEXT NOT NULL,      -- the finding type that triggered it
        step        INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,      -- the alert it belongs to
        message     TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX actions_run ON actions (run_id, id);
    ALTER TABLE alerts ADD COLUMN action TEXT;
    """,
    # The step the trainer actually stopped at (its end record), which may be well after
    # the step the stop was requested at.
    """
    ALTER TABLE actions ADD COLUMN honoured_step INTEGER;
    """,
    # Which alerts a notification carries, so GET /v1/alerts can say how delivery went.
    """
    ALTER TABLE outbox ADD COLUMN fingerprints TEXT;
    """,
)


class AlertDB:
    """A locked SQLite connection with migrations and a transaction helper."""

    def __init__(self, path: Path | str) -> None:
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        self._conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._conn.row_factory = sqlite3.Row
        self._lock = threading.RLock()
        self._conn.execute("PRAGMA busy_timeout = 5000")
        self._conn.execute("PRAGMA journal_mode = WAL")
        # NORMAL in WAL mode survives a process crash (kill -9), the failure a sidecar meets.
        self._conn.execute("PRAGMA synchronous = NORMAL")
        self._migrate()

    def _migrate(self) -> None:
        version = self._conn.execute("PRAGMA user_version").fetchone()[0]
        for i, script in enumerate(_MIGRATIONS[version:], start=version + 1):
            self._conn.executescript(script)
            self._conn.execute(f"PRAGMA user_version = {i}")

    @contextmanager
    def tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; everything inside commits together or not at all."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def check_writable(self) -> None:
        """Raise sqlite3.Error unless a write transaction can commit now."""
        with self.tx() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS _probe (x)")
            conn.execute("INSERT INTO _probe VALUES (1)")
            conn.execute("DELETE FROM _probe")

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._lock:
            return self._conn.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            self._conn.close()
