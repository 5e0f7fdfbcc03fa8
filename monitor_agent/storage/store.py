"""SQLite storage of records, runs, findings and detector snapshots.

One connection (a ``database.Database`` without a lock), used from the engine's single
worker thread (reads for the API go through the same thread, so nothing needs a lock).
WAL mode and batched transactions keep it fast; a record is acknowledged only after the
transaction holding it committed.

The app opens ``data_dir / "monitor.sqlite"``; here ":memory:", with one record sent
twice in a batch (a client's retry), stored once::

    >>> store = Store(":memory:")
    >>> row = RecordRow("gpt-7", 0, "step", 1, 1000.0, b'{"kind":"step","step":1,"loss":2.5}')
    >>> store.insert_records([row, row])   # the new row's id; None for a duplicate
    [1, None]
    >>> [(run.run_id, run.status) for run in store.runs()]
    [('gpt-7', 'running')]
    >>> store.records("gpt-7")
    [b'{"kind":"step","step":1,"loss":2.5}']
    >>> store.close()
"""

from __future__ import annotations

import shutil
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from monitor_agent.records import wire
from monitor_agent.storage.database import Database, StorageError, storage_errors

SCHEMA_VERSION = 1

_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS runs (
        run_id      TEXT PRIMARY KEY,
        run_record  BLOB,
        status      TEXT NOT NULL DEFAULT 'running',
        first_seen  REAL NOT NULL,
        last_seen   REAL NOT NULL,
        ended_at    REAL
    );
    CREATE TABLE IF NOT EXISTS records (
        id      INTEGER PRIMARY KEY,
        run_id  TEXT NOT NULL,
        rank    INTEGER NOT NULL,
        kind    TEXT NOT NULL,
        step    INTEGER NOT NULL,
        time    REAL,
        body    BLOB NOT NULL,
        UNIQUE (run_id, rank, kind, step)
    );
    CREATE TABLE IF NOT EXISTS findings (
        id       INTEGER PRIMARY KEY,
        run_id   TEXT NOT NULL,
        rank     INTEGER NOT NULL,
        step     INTEGER NOT NULL,
        type     TEXT NOT NULL,
        severity TEXT NOT NULL,
        layer    TEXT,
        time     REAL,
        body     BLOB NOT NULL
    );
    CREATE INDEX IF NOT EXISTS findings_run ON findings (run_id, id);
    -- Replaying the stored tail after a crash re-derives findings; keep each once.
    CREATE UNIQUE INDEX IF NOT EXISTS findings_identity
        ON findings (run_id, rank, step, type, COALESCE(layer, ''));
    CREATE TABLE IF NOT EXISTS detector_state (
        run_id     TEXT PRIMARY KEY,
        last_id    INTEGER NOT NULL,
        state      BLOB NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # The run's verdict (pipeline/verdict.py), JSON: shown after the run leaves memory.
    """
    ALTER TABLE runs ADD COLUMN verdict TEXT;
    """,
)


@dataclass(frozen=True, slots=True)
class RecordRow:
    """One validated record ready to store: its identity and canonical JSON body."""

    run_id: str
    rank: int
    kind: str
    step: int
    time: float | None
    body: bytes


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A run as the store knows it: identity, status and times (the run record's JSON)."""

    run_id: str
    run_record: bytes | None
    status: str
    first_seen: float
    last_seen: float
    ended_at: float | None
    verdict: str | None = None  # pipeline/verdict.py's Verdict as JSON; None before one


class Store:
    """The sidecar's SQLite database. Not thread-safe: use it from one thread.

    Every method raises ``StorageError`` (database.py) when SQLite fails, never
    ``sqlite3.Error``; writes say what could not be done ("cannot store records: ...").
    """

    def __init__(
        self, path: Path | str, *, busy_timeout_ms: int = 5000, max_bytes: int | None = None
    ) -> None:
        self._db = Database(path, _MIGRATIONS, busy_timeout_ms=busy_timeout_ms)
        self.path = self._db.path
        self._max_pages: int | None = None
        if max_bytes is not None:
            # Past this size writes fail exactly as on a full disk: the same code path.
            page = self._db.query("PRAGMA page_size")[0][0]
            self._max_pages = max(1, max_bytes // page)
            self._db.execute(f"PRAGMA max_page_count = {self._max_pages}")

    def close(self) -> None:
        self._db.close()

    # -- writes ---------------------------------------------------------------------------

    @storage_errors("cannot store records")
    def insert_records(self, rows: Sequence[RecordRow]) -> list[int | None]:
        """Store rows in one transaction; return each row's id, or None for a duplicate."""
        now = time.time()
        ids: list[int | None] = []
        with self._db.tx() as conn:
            for row in rows:
                ids.append(self._insert_one(conn, row, now))
        return ids

    def _insert_one(self, conn: sqlite3.Connection, row: RecordRow, now: float) -> int | None:
        cur = conn.execute(
            "INSERT INTO records (run_id, rank, kind, step, time, body) VALUES (?,?,?,?,?,?) "
            "ON CONFLICT DO NOTHING",
            (row.run_id, row.rank, row.kind, row.step, row.time, row.body),
        )
        if cur.rowcount == 0:
            return None
        run_body = row.body if row.kind == "run" else None
        conn.execute(
            "INSERT INTO runs (run_id, run_record, first_seen, last_seen) VALUES (?,?,?,?) "
            "ON CONFLICT (run_id) DO UPDATE SET last_seen = excluded.last_seen, "
            "run_record = COALESCE(excluded.run_record, runs.run_record)",
            (row.run_id, run_body, now, now),
        )
        return cur.lastrowid

    def set_status(self, run_id: str, status: str, ended_at: float | None) -> None:
        self._write(
            "UPDATE runs SET status = ?, ended_at = ? WHERE run_id = ?", (status, ended_at, run_id)
        )

    def set_verdict(self, run_id: str, verdict: str) -> None:
        self._write("UPDATE runs SET verdict = ? WHERE run_id = ?", (verdict, run_id))

    def insert_findings(self, findings: Sequence[dict[str, Any]]) -> None:
        if not findings:
            return
        rows = [
            (f["run_id"], f["rank"], f["step"], f["type"], f["severity"], f["layer"], f["time"],
             wire.dumps(f))
            for f in findings
        ]
        self._write_many(
            "INSERT OR IGNORE INTO findings (run_id, rank, step, type, severity, layer, time, body) "
            "VALUES (?,?,?,?,?,?,?,?)",
            rows,
        )

    def save_detector_state(self, run_id: str, last_id: int, state: bytes) -> None:
        self._write(
            "INSERT INTO detector_state (run_id, last_id, state, updated_at) VALUES (?,?,?,?) "
            "ON CONFLICT (run_id) DO UPDATE SET last_id = excluded.last_id, "
            "state = excluded.state, updated_at = excluded.updated_at",
            (run_id, last_id, state, time.time()),
        )

    def prune(self, run_id: str, rank: int, through_step: int, limit: int = 1 << 62) -> int:
        """Drop the step records of one run and rank up to ``through_step``, at most
        ``limit`` of them (oldest first); returns how many went. One index range: cheap
        however long the run's history."""
        cur = self._write(
            "DELETE FROM records WHERE id IN (SELECT id FROM records WHERE run_id = ? AND "
            "rank = ? AND kind = 'step' AND step <= ? ORDER BY step LIMIT ?)",
            (run_id, rank, through_step, limit),
        )
        return cur.rowcount

    def nth_newest_step(self, run_id: str, rank: int, n: int) -> int | None:
        """The step of the ``n``-th newest step record of a run and rank (1-based); None
        when it has fewer. An index walk of ``n`` entries: retention calls it once a pass."""
        rows = self._db.query(
            "SELECT step FROM records WHERE run_id = ? AND rank = ? AND kind = 'step' "
            "ORDER BY step DESC LIMIT 1 OFFSET ?", (run_id, rank, n - 1),
        )
        return rows[0][0] if rows else None

    @storage_errors("cannot write")
    def _write(self, sql: str, params: Sequence[Any]) -> sqlite3.Cursor:
        return self._db.execute(sql, params)

    @storage_errors("cannot write")
    def _write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        with self._db.tx() as conn:
            conn.executemany(sql, rows)

    def check_writable(self, headroom_bytes: int = 0) -> None:
        """Raise StorageError unless a write can commit now with ``headroom_bytes`` to spare.

        The headroom matters on a full disk: a tiny probe often still fits where the next
        batch does not, and readiness would flap between ready and 503.
        """
        free = self.free_bytes()
        if free is not None and free < headroom_bytes:
            raise StorageError(f"only {free} bytes free for the database, "
                               f"{headroom_bytes} needed for the next batch")
        with storage_errors("store not writable"):
            self._db.check_writable()

    def free_bytes(self) -> int | None:
        """Room left for the database: free disk space, or less under ``max_bytes``."""
        if self.path == ":memory:":
            return None
        free = shutil.disk_usage(Path(self.path).parent).free
        if self._max_pages is not None:
            page, used, unused = (self._db.query(f"PRAGMA {p}")[0][0]
                                  for p in ("page_size", "page_count", "freelist_count"))
            free = min(free, (self._max_pages - used + unused) * page)
        return free

    # -- reads ----------------------------------------------------------------------------

    def runs(self, run_id: str | None = None) -> list[StoredRun]:
        sql = ("SELECT run_id, run_record, status, first_seen, last_seen, ended_at, verdict "
               "FROM runs")
        if run_id is not None:
            rows = self._db.query(sql + " WHERE run_id = ?", (run_id,))
        else:
            rows = self._db.query(sql + " ORDER BY first_seen")
        return [StoredRun(*row) for row in rows]

    def records(
        self, run_id: str, since_step: int = 0, limit: int = 1000, kinds: Sequence[str] = ()
    ) -> list[bytes]:
        sql = "SELECT body FROM records WHERE run_id = ? AND step >= ?"
        params: list[Any] = [run_id, since_step]
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            params.extend(kinds)
        sql += (" ORDER BY step, CASE kind WHEN 'run' THEN 0 WHEN 'step' THEN 1 "
                "WHEN 'eval' THEN 2 ELSE 3 END, rank LIMIT ?")
        params.append(limit)
        return [row[0] for row in self._db.query(sql, params)]

    def last_record(self, run_id: str, rank: int, kind: str) -> bytes | None:
        rows = self._db.query(
            "SELECT body FROM records WHERE run_id = ? AND rank = ? AND kind = ? "
            "ORDER BY step DESC LIMIT 1",
            (run_id, rank, kind),
        )
        return rows[0][0] if rows else None

    def run_row(self, run_id: str) -> StoredRun | None:
        rows = [r for r in self.runs(run_id) if r.run_id == run_id]
        return rows[0] if rows else None

    def records_after(self, run_id: str, after_id: int) -> list[tuple[int, bytes]]:
        """Records of a run stored after ``after_id``, in arrival order (for recovery)."""
        return self._db.query(
            "SELECT id, body FROM records WHERE run_id = ? AND id > ? ORDER BY id",
            (run_id, after_id),
        )

    def detector_state(self, run_id: str) -> tuple[int, bytes] | None:
        rows = self._db.query(
            "SELECT last_id, state FROM detector_state WHERE run_id = ?", (run_id,)
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def findings(self, run_id: str, limit: int = 100) -> list[bytes]:
        rows = self._db.query(
            "SELECT body FROM findings WHERE run_id = ? ORDER BY id DESC LIMIT ?", (run_id, limit)
        )
        return [row[0] for row in rows]

    def finding_counts(self, run_id: str) -> dict[str, int]:
        return dict(self._db.query(
            "SELECT type, COUNT(*) FROM findings WHERE run_id = ? GROUP BY type", (run_id,)
        ))

    def finding_severity_counts(self, run_id: str) -> dict[str, int]:
        return dict(self._db.query(
            "SELECT severity, COUNT(*) FROM findings WHERE run_id = ? GROUP BY severity", (run_id,)
        ))

    def max_record_id(self) -> int:
        return int(self._db.query("SELECT COALESCE(MAX(id), 0) FROM records")[0][0])
