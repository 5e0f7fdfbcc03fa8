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
from monitor_agent.records.types import launcher_stopped
from monitor_agent.storage import uplink
from monitor_agent.storage.database import Database, StorageError, storage_errors

KIND_ORDER = ("run", "step", "eval", "checkpoint", "hang", "agreement", "end")
"""Within a step, records are read in this order of kinds (then by rank)."""
_KIND_ORDER_SQL = ("CASE kind " + " ".join(f"WHEN '{k}' THEN {i}" for i, k in enumerate(KIND_ORDER))
                   + f" ELSE {len(KIND_ORDER)} END")

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
    # Attempts of a run id (pipeline/attempts.py): a record's identity gains its attempt
    # (last, so retention's (run_id, rank, kind, step) range stays one index range), and
    # ``superseded_by`` marks what a later attempt replaced (NULL: the current history).
    # What existed before is attempt 1 of its run, sent under the legacy token "".
    """
    CREATE TABLE records_v2 (
        id            INTEGER PRIMARY KEY,
        run_id        TEXT NOT NULL,
        rank          INTEGER NOT NULL,
        kind          TEXT NOT NULL,
        step          INTEGER NOT NULL,
        time          REAL,
        body          BLOB NOT NULL,
        attempt       INTEGER NOT NULL DEFAULT 1,
        superseded_by INTEGER,
        UNIQUE (run_id, rank, kind, step, attempt)
    );
    INSERT INTO records_v2 (id, run_id, rank, kind, step, time, body)
        SELECT id, run_id, rank, kind, step, time, body FROM records;
    DROP TABLE records;
    ALTER TABLE records_v2 RENAME TO records;
    ALTER TABLE findings ADD COLUMN attempt INTEGER NOT NULL DEFAULT 1;
    DROP INDEX IF EXISTS findings_identity;
    CREATE UNIQUE INDEX findings_identity
        ON findings (run_id, rank, step, type, COALESCE(layer, ''), attempt);
    CREATE TABLE attempts (
        run_id          TEXT NOT NULL,
        number          INTEGER NOT NULL,
        kind            TEXT NOT NULL,
        start_step      INTEGER,
        started_at      REAL NOT NULL,
        superseded_from INTEGER,
        superseded_to   INTEGER,
        first_step      INTEGER,  -- of the step records it sent, kept up by insert_records
        last_step       INTEGER,
        steps           INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (run_id, number)
    );
    -- The latest step of the run's current history, kept up by every insert (listing a
    -- run not in memory must not scan its records).
    ALTER TABLE runs ADD COLUMN last_step INTEGER;
    UPDATE runs SET last_step = (SELECT MAX(step) FROM records r
                                 WHERE r.run_id = runs.run_id AND r.kind = 'step');
    CREATE TABLE attempt_tokens (
        run_id TEXT NOT NULL,
        token  TEXT NOT NULL,
        rank   INTEGER NOT NULL,
        number INTEGER NOT NULL,
        PRIMARY KEY (run_id, token)
    );
    INSERT INTO attempts (run_id, number, kind, start_step, started_at, first_step, last_step,
                          steps)
        SELECT run_id, 1, 'first', (SELECT MIN(step) FROM records r WHERE r.run_id = runs.run_id
                                     AND r.kind IN ('step', 'eval')), first_seen,
               (SELECT MIN(step) FROM records r WHERE r.run_id = runs.run_id AND r.kind = 'step'),
               last_step,
               (SELECT COUNT(*) FROM records r WHERE r.run_id = runs.run_id AND r.kind = 'step')
        FROM runs;
    INSERT INTO attempt_tokens (run_id, token, rank, number) SELECT run_id, '', 0, 1 FROM runs;
    -- Detector snapshots kept at steps spaced by powers of two back from the newest
    -- (``save_detector_state``), each tagged with the highest step it covers: a new attempt
    -- resuming from step S restores the newest one below S and replays only from there.
    CREATE TABLE detector_state_v2 (
        run_id     TEXT NOT NULL,
        last_id    INTEGER NOT NULL,
        max_step   INTEGER,
        state      BLOB NOT NULL,
        updated_at REAL NOT NULL,
        PRIMARY KEY (run_id, last_id)
    );
    INSERT INTO detector_state_v2 (run_id, last_id, max_step, state, updated_at)
        SELECT run_id, last_id, (SELECT last_step FROM runs WHERE runs.run_id = d.run_id),
               state, updated_at FROM detector_state d;
    DROP TABLE detector_state;
    ALTER TABLE detector_state_v2 RENAME TO detector_state;
    """,
    # The run's verdict (runs/verdict.py), JSON: shown after the run leaves memory.
    """
    ALTER TABLE runs ADD COLUMN verdict TEXT;
    """,
    # The checkpoint ledger (runs/checkpoint_ledger.py): one row per checkpoint a run's
    # attempt reported at a step; a later attempt that replaced the step (a resume from
    # before it, a restart) leaves it out of the current history, as for findings.
    """
    CREATE TABLE checkpoints (
        run_id  TEXT NOT NULL,
        step    INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        rank    INTEGER NOT NULL,
        path    TEXT NOT NULL,
        time    REAL,
        bytes   INTEGER,
        tag     TEXT,
        token   TEXT,      -- the sending process's attempt token
        PRIMARY KEY (run_id, step, attempt)
    );
    """,
    # One run, one brain (monitor_agent/cluster): a record a node sidecar forwarded to this
    # one, the run's leader, as a digest: ``origin`` is that node's rank (NULL: a record of
    # this sidecar's own client). The leader judges those across ranks only.
    """
    ALTER TABLE records ADD COLUMN origin INTEGER;
    """,
    *uplink.MIGRATIONS,
    # The data position a checkpoint's state resumes from (docs/format.md): a rollback to
    # it names where the data stream resumes, not only the step.
    """
    ALTER TABLE checkpoints ADD COLUMN position INTEGER;
    """,
    # The goodput ledger (runs/goodput.py), JSON: where the run's time went, kept beside
    # its snapshots (a rebuilt history forgets the work it discarded; the ledger must not).
    """
    CREATE TABLE goodput (
        run_id     TEXT PRIMARY KEY,
        last_id    INTEGER NOT NULL,
        state      BLOB NOT NULL,
        updated_at REAL NOT NULL
    );
    """,
    # Which ranks sent step records in each attempt (pipeline/attempts.py): a checkpoint
    # is accepted only from one of them, the processes that train in that attempt.
    """
    CREATE TABLE attempt_ranks (
        run_id  TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        rank    INTEGER NOT NULL,
        PRIMARY KEY (run_id, attempt, rank)
    );
    INSERT OR IGNORE INTO attempt_ranks (run_id, attempt, rank)
        SELECT DISTINCT run_id, attempt, rank FROM records WHERE kind = 'step';
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
    attempt: int = 1
    superseded_by: int | None = None  # stored already replaced by a later attempt
    origin: int | None = None  # the node rank a run leader's digest came from (cluster/)


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """One row of the checkpoint ledger: a checkpoint an attempt of a run reported."""

    run_id: str
    step: int
    attempt: int
    rank: int
    path: str
    time: float | None
    bytes: int | None = None
    tag: str | None = None
    token: str | None = None
    position: int | None = None  # the data position its state resumes from


@dataclass(frozen=True, slots=True)
class StoredAttempt:
    """One attempt of a run id (pipeline/attempts.py): its kind (pending until its first
    step arrives), start step, the range of the history before it that it replaced, and
    the first and last step and number of the step records it sent."""

    number: int
    kind: str
    start_step: int | None
    started_at: float
    superseded_from: int | None
    superseded_to: int | None
    first_step: int | None = None
    last_step: int | None = None
    steps: int = 0


@dataclass(frozen=True, slots=True)
class StoredRun:
    """A run as the store knows it: identity, status and times (the run record's JSON)."""

    run_id: str
    run_record: bytes | None
    status: str
    first_seen: float
    last_seen: float
    ended_at: float | None
    last_step: int | None = None  # of its current history (pipeline/attempts.py)
    verdict: str | None = None  # runs/verdict.py's Verdict as JSON; None before one


def _thinned(back: list[int]) -> set[int]:
    """Which snapshots to keep, given how far back from the newest each is (newest first):
    the newest and the oldest, and each other one unless its kept newer neighbour and its
    older neighbour are within a factor of two of each other (then that neighbour serves
    every resume it would). A simulation of 2,000 snapshots 100 steps apart keeps at most 21 and
    never answers a resume from a snapshot more than 2x as far back as asked.

        >>> sorted(_thinned([0, 100, 200, 300, 400, 800, 1600]))
        [0, 1, 2, 4, 5, 6]
    """
    keep, newer = {0}, 0
    for i in range(1, len(back)):
        if i < len(back) - 1 and back[i + 1] <= 2 * max(newer, 1):
            continue
        keep.add(i)
        newer = back[i]
    return keep


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
        self.uplink = uplink.UplinkQueue(self._db)
        self._max_pages: int | None = None
        if max_bytes is not None:
            # Past this size writes fail exactly as on a full disk: the same code path.
            page = self._db.query("PRAGMA page_size")[0][0]
            self._max_pages = max(1, max_bytes // page)
            self._db.execute(f"PRAGMA max_page_count = {self._max_pages}")

    def check_integrity(self) -> None:
        """``StorageError`` (``corrupt``) unless SQLite's quick check passes (database.py)."""
        self._db.check_integrity()

    def close(self) -> None:
        self._db.close()

    # -- writes ---------------------------------------------------------------------------

    @storage_errors("cannot store records")
    def insert_records(self, rows: Sequence[RecordRow]) -> list[int | None]:
        """Store rows in one transaction; return each row's id, or None for a duplicate."""
        now = time.time()
        ids: list[int | None] = []
        sent: dict[tuple[str, int], list[int]] = {}  # (run, attempt) -> its new steps
        stepped: set[tuple[str, int, int]] = set()  # (run, attempt, rank) that sent them
        with self._db.tx() as conn:
            for row in rows:
                row_id = self._insert_one(conn, row, now)
                ids.append(row_id)
                if row_id is not None and row.kind == "step":
                    sent.setdefault((row.run_id, row.attempt), []).append(row.step)
                    stepped.add((row.run_id, row.attempt, row.rank))
            conn.executemany(
                "INSERT OR IGNORE INTO attempt_ranks (run_id, attempt, rank) VALUES (?,?,?)",
                sorted(stepped))
            for (run_id, attempt), steps in sent.items():
                conn.execute(
                    "UPDATE attempts SET first_step = MIN(COALESCE(first_step, ?), ?), "
                    "last_step = MAX(COALESCE(last_step, ?), ?), steps = steps + ? "
                    "WHERE run_id = ? AND number = ?",
                    (min(steps), min(steps), max(steps), max(steps), len(steps), run_id,
                     attempt))
        return ids

    def _insert_one(self, conn: sqlite3.Connection, row: RecordRow, now: float) -> int | None:
        cur = conn.execute(
            "INSERT INTO records (run_id, rank, kind, step, time, body, attempt, superseded_by, "
            "origin) VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
            (row.run_id, row.rank, row.kind, row.step, row.time, row.body, row.attempt,
             row.superseded_by, row.origin),
        )
        if cur.rowcount == 0:
            return None
        run_body = row.body if row.kind == "run" else None
        step = row.step if row.kind == "step" and row.superseded_by is None else None
        conn.execute(
            "INSERT INTO runs (run_id, run_record, first_seen, last_seen, last_step) "
            "VALUES (?,?,?,?,?) "
            "ON CONFLICT (run_id) DO UPDATE SET last_seen = excluded.last_seen, "
            "run_record = COALESCE(excluded.run_record, runs.run_record), "
            "last_step = CASE WHEN excluded.last_step IS NULL THEN runs.last_step "
            "WHEN runs.last_step IS NULL THEN excluded.last_step "
            "ELSE MAX(runs.last_step, excluded.last_step) END",
            (row.run_id, run_body, now, now, step),
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
             wire.dumps(f), f.get("attempt", 1))
            for f in findings
        ]
        self._write_many(
            "INSERT OR IGNORE INTO findings (run_id, rank, step, type, severity, layer, time, body, "
            "attempt) VALUES (?,?,?,?,?,?,?,?,?)",
            rows,
        )

    @storage_errors("cannot store a checkpoint")
    def add_checkpoint(self, c: StoredCheckpoint) -> StoredCheckpoint:
        """Keep a checkpoint in the ledger, once per (run, step, attempt); return the row
        the ledger holds for that key (an earlier one wins: the engine refused a different
        path for it before storing, so a replay or another rank's copy is the same)."""
        with self._db.tx() as conn:
            conn.execute(
                "INSERT INTO checkpoints (run_id, step, attempt, rank, path, time, bytes, tag, "
                "token, position) VALUES (?,?,?,?,?,?,?,?,?,?) ON CONFLICT DO NOTHING",
                (c.run_id, c.step, c.attempt, c.rank, c.path, c.time, c.bytes, c.tag,
                 c.token, c.position))
            row = conn.execute(
                "SELECT run_id, step, attempt, rank, path, time, bytes, tag, token, position "
                "FROM checkpoints WHERE run_id = ? AND step = ? AND attempt = ?",
                (c.run_id, c.step, c.attempt)).fetchone()
        return StoredCheckpoint(*row)

    @storage_errors("cannot store a snapshot")
    def save_detector_state(self, run_id: str, last_id: int, state: bytes,
                            max_step: int | None = None) -> None:
        """Keep a snapshot of a run's detectors covering its records up to ``last_id``,
        whose highest step is ``max_step`` (None: unknown, never restored for a resume).

        Older ones are thinned (``_thinned``) so that going back any number of steps from
        the newest finds one at most twice as far back: about 2 log2(steps) per run (20 at
        200,000 steps), and a resume replays about what it went back, not the run's whole
        history."""
        with self._db.tx() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO detector_state (run_id, last_id, max_step, state, "
                "updated_at) VALUES (?,?,?,?,?)", (run_id, last_id, max_step, state, time.time()))
            rows = conn.execute(
                "SELECT last_id, max_step FROM detector_state WHERE run_id = ? "
                "ORDER BY last_id DESC", (run_id,)).fetchall()
            top = max_step if max_step is not None else 0
            keep = _thinned([top - (step if step is not None else top) for _, step in rows])
            conn.executemany("DELETE FROM detector_state WHERE run_id = ? AND last_id = ?",
                             [(run_id, row_id) for i, (row_id, _) in enumerate(rows)
                              if i not in keep])

    @storage_errors("cannot store a goodput ledger")
    def save_goodput(self, run_id: str, last_id: int, state: bytes) -> None:
        """Keep a run's goodput ledger (runs/goodput.py) as of record ``last_id``."""
        self._write("INSERT OR REPLACE INTO goodput (run_id, last_id, state, updated_at) "
                    "VALUES (?,?,?,?)", (run_id, last_id, state, time.time()))

    def goodput(self, run_id: str) -> bytes | None:
        """The run's goodput ledger as last kept, or None."""
        rows = self._db.query("SELECT state FROM goodput WHERE run_id = ?", (run_id,))
        return rows[0][0] if rows else None

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

    # -- attempts (pipeline/attempts.py decides; these only keep what it decided) ---------

    def add_attempt(self, run_id: str, number: int, token: str, rank: int, now: float) -> None:
        """A new attempt, pending until its first step, and the token that began it."""
        with storage_errors("cannot store an attempt"), self._db.tx() as conn:
            conn.execute("INSERT INTO attempts (run_id, number, kind, started_at) "
                         "VALUES (?,?,'pending',?)", (run_id, number, now))
            conn.execute("INSERT INTO attempt_tokens (run_id, token, rank, number) "
                         "VALUES (?,?,?,?)", (run_id, token, rank, number))

    def add_attempt_token(self, run_id: str, token: str, rank: int, number: int) -> None:
        """Another process (a rank of the same launch) joining attempt ``number``."""
        self._write("INSERT OR IGNORE INTO attempt_tokens (run_id, token, rank, number) "
                    "VALUES (?,?,?,?)", (run_id, token, rank, number))

    def settle_attempt(self, run_id: str, attempt: StoredAttempt) -> None:
        """Record a pending attempt's kind and start, in one transaction with what follows
        from it: earlier attempts' records it replaced are marked ``superseded_by`` it (a
        restart replaces all of them, a resume its start step on, and the run and end
        records: the new run record describes the run now, and an end record ended an
        attempt, not the run), the detector snapshot goes (it covers replaced records) and
        the run is running again."""
        n, start = attempt.number, attempt.start_step
        replaced = ("1" if attempt.kind == "restarted" else
                    "(kind IN ('run', 'end') OR step >= ?)")
        params: tuple[Any, ...] = (n, run_id, n) + (() if attempt.kind == "restarted"
                                                     else (start,))
        with storage_errors("cannot store an attempt"), self._db.tx() as conn:
            conn.execute(
                "UPDATE attempts SET kind = ?, start_step = ?, superseded_from = ?, "
                "superseded_to = ? WHERE run_id = ? AND number = ?",
                (attempt.kind, start, attempt.superseded_from, attempt.superseded_to, run_id, n))
            conn.execute(
                "UPDATE records SET superseded_by = ? WHERE run_id = ? AND attempt < ? AND "
                f"superseded_by IS NULL AND {replaced}", params)
            # Snapshots covering a replaced step go; the newest one left is where the run is
            # rebuilt from (registry.py).
            kept = "0" if attempt.kind == "restarted" else "max_step < ?"
            conn.execute(f"DELETE FROM detector_state WHERE run_id = ? AND NOT "
                         f"COALESCE({kept}, 0)",
                         (run_id,) if attempt.kind == "restarted" else (run_id, start))
            # One scan of the run's records, once per attempt: what is left of its history.
            conn.execute(
                "UPDATE runs SET status = 'running', ended_at = NULL, last_step = "
                "(SELECT MAX(step) FROM records WHERE run_id = ? AND kind = 'step' AND "
                "superseded_by IS NULL) WHERE run_id = ?", (run_id, run_id))

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
        sql = ("SELECT run_id, run_record, status, first_seen, last_seen, ended_at, last_step, "
               "verdict "
               "FROM runs")
        if run_id is not None:
            rows = self._db.query(sql + " WHERE run_id = ?", (run_id,))
        else:
            rows = self._db.query(sql + " ORDER BY first_seen")
        return [StoredRun(*row) for row in rows]

    def runs_chunk(self, after: tuple[float, str] | None, max_rows: int) -> list[StoredRun]:
        """Stored runs after ``after`` (``(first_seen, run_id)``), oldest first, without
        their run record: a page of the runs list."""
        sql = ("SELECT run_id, NULL, status, first_seen, last_seen, ended_at, last_step, verdict "
               "FROM runs"
               + (" WHERE (first_seen, run_id) > (?, ?)" if after is not None else "")
               + " ORDER BY first_seen, run_id LIMIT ?")
        params = (*after, max_rows) if after is not None else (max_rows,)
        return [StoredRun(*row) for row in self._db.query(sql, params)]

    def records(
        self, run_id: str, since_step: int = 0, limit: int = 1000, kinds: Sequence[str] = (),
        attempt: int | None = None,
    ) -> list[bytes]:
        """The run's current history (records no later attempt replaced), or everything
        ``attempt`` sent, replaced or not."""
        sql = "SELECT body FROM records WHERE run_id = ? AND step >= ?"
        params: list[Any] = [run_id, since_step]
        if attempt is None:
            sql += " AND superseded_by IS NULL"
        else:
            sql += " AND attempt = ?"
            params.append(attempt)
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            params.extend(kinds)
        sql += f" ORDER BY step, {_KIND_ORDER_SQL}, rank LIMIT ?"
        params.append(limit)
        return [row[0] for row in self._db.query(sql, params)]

    def records_chunk(
        self, run_id: str, since_step: int, after: tuple[int, int, int] | None,
        kinds: Sequence[str], max_rows: int, max_bytes: int, attempt: int | None = None,
    ) -> list[tuple[tuple[int, int, int], bytes]]:
        """The next records of a read answer, in ``records``' order and of the same history
        (the current one, or what ``attempt`` sent: either holds one record per key), each
        with its key ``(step, kind's place in KIND_ORDER, rank)``: those after ``after``, at
        most ``max_rows``, and no more than ``max_bytes`` of bodies (but at least one). Keys
        and sizes are read first and bodies only for the chosen rows, so a chunk costs what
        it returns, however large the records behind it are."""
        order = _KIND_ORDER_SQL
        sql = (f"SELECT step, {order}, rank, id, length(body) FROM records "
               "WHERE run_id = ? AND step >= ?")
        params: list[Any] = [run_id, since_step]
        if attempt is None:
            sql += " AND superseded_by IS NULL"
        else:
            sql += " AND attempt = ?"
            params.append(attempt)
        if after is not None:
            sql += f" AND step >= ? AND (step, {order}, rank) > (?, ?, ?)"
            params.extend((after[0], *after))
        if kinds:
            sql += f" AND kind IN ({','.join('?' * len(kinds))})"
            params.extend(kinds)
        sql += f" ORDER BY step, {order}, rank LIMIT ?"
        params.append(max_rows)
        chosen: list[tuple[tuple[int, int, int], int]] = []
        total = 0
        for step, place, rank, row_id, size in self._db.query(sql, params):
            if chosen and total + size > max_bytes:
                break
            chosen.append(((step, place, rank), row_id))
            total += size
        bodies = self._bodies("records", [row_id for _, row_id in chosen])
        return [(key, bodies[row_id]) for key, row_id in chosen if row_id in bodies]

    def findings_chunk(self, run_id: str, before_id: int | None, max_rows: int,
                       max_bytes: int, current: bool = False) -> list[tuple[int, bytes]]:
        """The next findings of a read answer, newest first, each with its id: those older
        than ``before_id``, bounded as ``records_chunk`` bounds records (``current``: only
        those about the current history, as ``findings``)."""
        sql = f"SELECT id, length(body) FROM findings f WHERE run_id = ?{_current(current)}"
        params: list[Any] = [run_id]
        if before_id is not None:
            sql += " AND id < ?"
            params.append(before_id)
        sql += " ORDER BY id DESC LIMIT ?"
        params.append(max_rows)
        chosen: list[int] = []
        total = 0
        for row_id, size in self._db.query(sql, params):
            if chosen and total + size > max_bytes:
                break
            chosen.append(row_id)
            total += size
        bodies = self._bodies("findings", chosen)
        return [(row_id, bodies[row_id]) for row_id in chosen if row_id in bodies]

    def _bodies(self, table: str, ids: Sequence[int]) -> dict[int, bytes]:
        if not ids:
            return {}
        return dict(self._db.query(
            f"SELECT id, body FROM {table} WHERE id IN ({','.join('?' * len(ids))})", ids))

    def placing_records(self, run_id: str, ranks: Sequence[int], attempt: int,
                        replaced: bool = False) -> tuple[int, list[bytes]]:
        """The run records of this sidecar's own ranks (not forwarded by a node sidecar) in
        the newest attempt up to ``attempt`` that has any, of the current history, and that
        attempt: the first one stored (what placed the run, pipeline/placement.py
        ``Placement.place``) and the last (what the run says of itself now); ``replaced``:
        of the whole history, the run records a later attempt superseded too. One index
        range per rank."""
        found: list[tuple[int, int, bytes]] = []
        for rank in ranks:
            found += self._db.query(
                "SELECT attempt, id, body FROM records WHERE run_id = ? AND rank = ? AND "
                "kind = 'run' AND origin IS NULL AND attempt <= ?"
                + ("" if replaced else " AND superseded_by IS NULL"),
                (run_id, rank, attempt))
        if not found:
            return 0, []
        newest = max(a for a, _, _ in found)
        mine = sorted((i, body) for a, i, body in found if a == newest)
        return newest, [body for _, body in (mine if len(mine) == 1 else (mine[0], mine[-1]))]

    def last_record(self, run_id: str, rank: int, kind: str) -> bytes | None:
        rows = self._db.query(
            "SELECT body FROM records WHERE run_id = ? AND rank = ? AND kind = ? "
            "AND superseded_by IS NULL ORDER BY step DESC LIMIT 1",
            (run_id, rank, kind),
        )
        return rows[0][0] if rows else None

    def run_row(self, run_id: str) -> StoredRun | None:
        rows = [r for r in self.runs(run_id) if r.run_id == run_id]
        return rows[0] if rows else None

    def records_after(self, run_id: str, after_id: int, replaced: bool = False,
                      ) -> list[tuple[int, int, bytes, int | None]]:
        """(id, attempt, body, origin) of the run's current history stored after
        ``after_id``, in arrival order (for recovery: replaced records are never fed
        again to the detectors); ``replaced``: those a later attempt replaced too (the
        goodput ledger sees every stored record); ``origin``: the node a leader's digest
        came from, None for its own."""
        current = "" if replaced else "AND superseded_by IS NULL "
        return self._db.query(
            "SELECT id, attempt, body, origin FROM records WHERE run_id = ? AND id > ? "
            f"{current}ORDER BY id",
            (run_id, after_id),
        )

    def attempts(self, run_id: str) -> list[StoredAttempt]:
        """The run's attempts, oldest first."""
        rows = self._db.query(
            "SELECT number, kind, start_step, started_at, superseded_from, superseded_to, "
            "first_step, last_step, steps FROM attempts WHERE run_id = ? ORDER BY number",
            (run_id,))
        return [StoredAttempt(*row) for row in rows]

    def attempt_ends(self, run_id: str) -> dict[int, str]:
        """Attempt number -> how its processes ended (their ``end`` records, replaced ones
        included; ``failed`` over ``stopped`` over ``completed`` when ranks differ); an
        attempt whose processes sent no end record (killed) is absent, and so is one whose
        processes only said their launcher stopped them (``launcher_stopped``: one of them
        died, or the job was stopped; as a worker killed by it, which says nothing)."""
        worst = {"completed": 0, "stopped": 1, "failed": 2}
        ends: dict[int, str] = {}
        for attempt, body in self._db.query(
                "SELECT attempt, body FROM records WHERE run_id = ? AND kind = 'end'", (run_id,)):
            try:
                data = wire.loads(body)
                status, error = str(data.get("status")), data.get("error")
            except (TypeError, ValueError, AttributeError):
                continue
            if launcher_stopped(status, error if isinstance(error, str) else None):
                continue
            if worst.get(status, 2) >= worst.get(ends.get(attempt, "completed"), 0):
                ends[attempt] = status if status in worst else "failed"
        return ends

    def rank_ends(self, run_id: str, attempt: int) -> dict[int, tuple[str, str | None]]:
        """Rank -> (status, error) of the ``end`` records attempt ``attempt``'s processes
        sent (the last a rank sent, where it sent several); a rank killed without a word is
        absent (runs/attempt_end.py)."""
        ends: dict[int, tuple[str, str | None]] = {}
        for rank, body in self._db.query(
                "SELECT rank, body FROM records WHERE run_id = ? AND kind = 'end' "
                "AND attempt = ? ORDER BY id", (run_id, attempt)):
            try:
                data = wire.loads(body)
                error = data.get("error")
                ends[int(rank)] = (str(data.get("status")),
                                   error if isinstance(error, str) else None)
            except (TypeError, ValueError, AttributeError):
                continue
        return ends

    def attempt_tokens(self, run_id: str) -> list[tuple[str, int, int]]:
        """(token, rank that first sent it, attempt number) of every process of the run."""
        return self._db.query(
            "SELECT token, rank, number FROM attempt_tokens WHERE run_id = ?", (run_id,))

    def attempt_ranks(self, run_id: str) -> list[tuple[int, int]]:
        """(attempt number, rank) of every rank that sent a step record in an attempt."""
        return self._db.query(
            "SELECT attempt, rank FROM attempt_ranks WHERE run_id = ?", (run_id,))

    def history_span(self, run_id: str, before_attempt: int) -> tuple[int | None, int | None]:
        """First and last step of the run's current history that attempts before
        ``before_attempt`` sent (steps and evals); (None, None) when there is none."""
        row = self._db.query(
            "SELECT MIN(step), MAX(step) FROM records WHERE run_id = ? AND attempt < ? AND "
            "superseded_by IS NULL AND kind IN ('step', 'eval')", (run_id, before_attempt))
        return row[0][0], row[0][1]

    def detector_state(self, run_id: str) -> tuple[int, bytes] | None:
        """The run's newest snapshot: (the last record id it covers, its state)."""
        rows = self._db.query(
            "SELECT last_id, state FROM detector_state WHERE run_id = ? "
            "ORDER BY last_id DESC LIMIT 1", (run_id,)
        )
        return (rows[0][0], rows[0][1]) if rows else None

    def findings(self, run_id: str, limit: int = 100, current: bool = False) -> list[bytes]:
        """The run's findings, newest first; ``current``: only those about its current
        history (not about steps a later attempt replaced, pipeline/attempts.py)."""
        rows = self._db.query(
            f"SELECT body FROM findings f WHERE run_id = ?{_current(current)} "
            "ORDER BY id DESC LIMIT ?",
            (run_id, limit)
        )
        return [row[0] for row in rows]

    def abandoned_findings(self, run_id: str, types: Sequence[str]) -> list[bytes]:
        """The run's findings of ``types`` at error severity or above about steps a later
        attempt replaced (the abandoned branches of pipeline/attempts.py), oldest first.
        Few by nature (they page): the verdict reads them whenever the run is loaded."""
        marks = ",".join("?" * len(types))
        rows = self._db.query(
            f"SELECT body FROM findings f WHERE run_id = ? AND type IN ({marks}) AND "
            "severity IN ('error', 'critical') AND NOT (1"
            f"{_current(True)}) ORDER BY id", (run_id, *types))
        return [row[0] for row in rows]

    def checkpoints(self, run_id: str) -> list[StoredCheckpoint]:
        """The checkpoints of the run's current history (none a later attempt replaced),
        oldest first."""
        rows = self._db.query(
            "SELECT run_id, step, attempt, rank, path, time, bytes, tag, token, position "
            f"FROM checkpoints f WHERE run_id = ?{_current(True)} ORDER BY step, attempt",
            (run_id,))
        return [StoredCheckpoint(*row) for row in rows]

    def page_findings(self, run_id: str) -> list[bytes]:
        """The run's findings of severity error and up about its current history, oldest
        first: what the checkpoint ledger judges by (few: each one paged someone)."""
        rows = self._db.query(
            "SELECT body FROM findings f WHERE run_id = ? AND severity IN ('error', 'critical')"
            f"{_current(True)} ORDER BY id", (run_id,))
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


def _current(current: bool) -> str:
    """The SQL condition keeping findings (``f``) about a run's current history: none that
    a later attempt replaced (pipeline/attempts.py), when ``current``."""
    return ("" if not current else
            " AND NOT EXISTS (SELECT 1 FROM attempts t WHERE t.run_id = f.run_id AND "
            "t.number > f.attempt AND (t.kind = 'restarted' OR "
            "(t.kind = 'resumed' AND t.start_step <= f.step)))")
