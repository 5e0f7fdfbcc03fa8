"""``HistoryIndexer``: keeps the chart history in step with the sidecar's records.

Runs on a thread of its own with its own connections: a read-only one to the records
(engine state is never touched) and the history database it owns. Restarts resume from
the last folded record id; deleting the history rebuilds it from the records.

Charts draw a run's current history (pipeline/attempts.py): a record a later attempt had
replaced before it was folded is skipped, and the first step of an attempt that replaced
history already folded (a resume from a checkpoint, a new run reusing the id) drops the
run's history and folds its current history again, once per attempt (the history's
``attempts`` table remembers which): one line, never a sawtooth of two branches.

The app starts one with its databases (serving/app.py: ``HistoryIndexer(settings.db_path,
services.history_db, ema_alpha, default_warmup)``, ``start()``, and ``stop()`` on shutdown);
its thread calls ``catch_up`` until nothing is left, then waits for more. One batch, by
hand::

    >>> import tempfile
    >>> from monitor_agent.storage.store import RecordRow, Store
    >>> tmp = tempfile.TemporaryDirectory()
    >>> store = Store(Path(tmp.name, "monitor.sqlite"))
    >>> step = {"kind": "step", "run_id": "gpt-7", "step": 1, "time": 1.0, "loss": 2.5}
    >>> store.insert_records([RecordRow("gpt-7", 0, "step", 1, 1.0, wire.dumps(step))])
    [1]
    >>> indexer = HistoryIndexer(store.path, Path(tmp.name, "history.sqlite"), 0.99, 0)
    >>> src = sqlite3.connect(store.path)
    >>> indexer.catch_up(src)   # True: a whole batch was folded, there may be more
    False
    >>> indexer.builder.db.execute("SELECT run_id, step, loss FROM steps").fetchall()
    [('gpt-7', 1, 2.5)]
    >>> for db in (src, indexer.builder.db, store):
    ...     db.close()
    >>> tmp.cleanup()
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from pathlib import Path

from monitor_agent.records import wire
from monitor_agent.storage.database import StorageError, storage_errors
from monitor_agent.ui.history import History, HistoryBuilder, open_history

log = logging.getLogger(__name__)


class HistoryIndexer:
    """Follows the sidecar's records table and folds new records into the history.

    Runs on its own thread with its own connections: a read-only one to the records, and
    the history database it owns. Restarts resume from the last folded record id.
    """

    BATCH = 100
    DUTY = 0.1

    def __init__(self, records_db: Path, history_db: Path, ema_alpha: float,
                 default_warmup: int, interval: float = 0.2) -> None:
        self.records_db, self.history_db = records_db, history_db
        self.ema_alpha, self.default_warmup = ema_alpha, default_warmup
        self.interval = interval
        self._db: History | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="history", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _loop(self) -> None:
        # Opened here, not in the app's startup: a history that cannot be written (a full
        # disk) costs the charts, never the sidecar's readiness.
        src, last_error = None, None
        try:
            while not self._stop.is_set():
                try:
                    if src is None:
                        self._open()
                        src = self._records()
                    started = time.perf_counter()
                    busy = self.catch_up(src)
                    spent = time.perf_counter() - started
                except StorageError as exc:
                    if str(exc) != last_error:  # once per cause, not every retry
                        log.warning("chart history: %s; retrying every 5 s", exc)
                    last_error, busy = str(exc), False
                    self._stop.wait(5.0)
                    continue
                last_error = None
                # At most DUTY of a core, in short folds: the fold holds the GIL, and at 25%
                # an ingest bench of GPT-sized records every step still lost ~20% of its rate
                # and tripled its p99. Under such a burst the charts lag, never the ingest;
                # records the client sends by default (layer stats every 25 steps) fold in
                # ~20 us, so the charts keep up with any realistic load.
                pause = spent * (1 - self.DUTY) / self.DUTY
                self._stop.wait(pause if busy else max(pause, self.interval))
        finally:
            if src is not None:
                src.close()
            if self._db is not None:
                self._db.close()

    def _open(self) -> None:
        if self._db is None:
            self._db = open_history(self.history_db)
            self.builder = HistoryBuilder(self._db, self.ema_alpha, self.default_warmup)

    @storage_errors()
    def _records(self) -> sqlite3.Connection:
        """The read-only connection to the sidecar's records."""
        return sqlite3.connect(f"file:{self.records_db}?mode=ro", uri=True)

    @storage_errors()
    def catch_up(self, src: sqlite3.Connection) -> bool:
        """Fold one batch of new records; True when there may be more (StorageError when
        either database fails)."""
        self._open()
        assert self._db is not None
        row = self._db.execute("SELECT last_id FROM cursor").fetchone()
        last = row[0] if row else 0
        rows = src.execute(
            "SELECT id, body, run_id, attempt, superseded_by FROM records WHERE id > ? "
            "AND kind != 'end' ORDER BY id LIMIT ?", (last, self.BATCH)).fetchall()
        if not rows:
            return False
        for row_id, body, run_id, attempt, superseded_by in rows:
            if superseded_by is not None:
                continue
            if attempt > 1 and self._replaces_history(src, run_id, attempt):
                self.builder.commit()
                self._refold(src, run_id, row_id, attempt)
            self._add(body)
        self.builder.commit(rows[-1][0])
        return len(rows) == self.BATCH

    def _add(self, body: bytes) -> None:
        try:
            self.builder.add(wire.loads(body))
        except (ValueError, KeyError, TypeError) as exc:  # stored but odd: skip, not stop
            log.warning("history: record skipped: %s", exc)

    def _replaces_history(self, src: sqlite3.Connection, run_id: str, attempt: int) -> bool:
        """Whether ``attempt`` is settled, replaced some of the run's history, and its
        history was not folded again for it yet."""
        assert self._db is not None
        row = self._db.execute("SELECT number FROM attempts WHERE run_id = ?",
                               (run_id,)).fetchone()
        if attempt <= (row[0] if row else 1):
            return False
        found = src.execute("SELECT kind, superseded_from FROM attempts WHERE run_id = ? AND "
                            "number = ?", (run_id, attempt)).fetchone()
        return found is not None and found[0] != "pending" and found[1] is not None

    def _refold(self, src: sqlite3.Connection, run_id: str, before_id: int,
                attempt: int) -> None:
        """The run's history folded again from its current history before ``before_id``."""
        assert self._db is not None
        self.builder.forget(run_id)
        cursor = src.execute(
            "SELECT body FROM records WHERE run_id = ? AND id < ? AND superseded_by IS NULL "
            "AND kind != 'end' ORDER BY id", (run_id, before_id))
        while chunk := cursor.fetchmany(self.BATCH):
            for (body,) in chunk:
                self._add(body)
            self.builder.commit()
        self._db.execute("INSERT OR REPLACE INTO attempts VALUES (?, ?)", (run_id, attempt))
