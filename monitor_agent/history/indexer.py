"""``HistoryIndexer``: keeps the chart history in step with the sidecar's records.

Runs on a thread of its own with its own connections: a read-only one to the records
(engine state is never touched) and the history database it owns. Restarts resume from
the last folded record id; deleting the history rebuilds it from the records.

Charts draw a run's current history (pipeline/attempts.py): a record a later attempt had
replaced before it was folded is skipped, and the first step of an attempt that replaced
history already folded (a resume from a checkpoint, a new run reusing the id) drops the
run's history and folds its current history again, once per attempt (the history's
``attempts`` table remembers which): one line, never a sawtooth of two branches. What a
resume abandoned (a rollback to a checkpoint) is kept beside it, once, as a branch of its
own (``branch``): the steps it replaced, thinned to ``MAX_BRANCH_POINTS`` per rank, which
the run page draws faded, ending where it was given up.

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
    >>> src = Database(store.path, (), readonly=True)
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
import math
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from monitor_agent.history.builder import MAX_NAMES, HistoryBuilder
from monitor_agent.history.schema import (
    BRANCH_TABLES,
    HISTORY_SOURCE,
    HISTORY_TABLES,
    History,
    open_history,
)
from monitor_agent.records import wire
from monitor_agent.storage.database import Database, StorageError, storage_errors

log = logging.getLogger(__name__)

RETRY_S = 5.0
# A storage failure of the history is reported in /readyz once it outlasted this many
# retries in a row (10 s and more): a full disk that frees in a moment is the record
# store's to report, a history that cannot open at all (no rights, a directory in its
# place) is the history's own.
REPORT_AFTER = 3

MAX_BRANCH_POINTS = 1000
"""Steps kept per rank of an abandoned branch, evenly spaced, its last step always among
them: a chart draws it as context at most about this wide, and a resume far back (100,000
abandoned steps of a GPT, tens of kB each) reads this many records once, not all of them."""


class HistoryIndexer:
    """Follows the sidecar's records table and folds new records into the history.

    Runs on its own thread with its own connections: a read-only one to the records, and
    the history database it owns. Restarts resume from the last folded record id.

    The records (``monitor.sqlite``) are the source of truth and the history is derived
    from them, so the history repairs itself rather than being repaired by hand:

    - a record that cannot be folded (a value no consumer expected, stored by an older
      version) is logged, counted (``on_skip``) and skipped; the thread goes on;
    - a corrupt history (found at open by ``quick_check``, by the fold, or by a reader:
      ``request_repair``) is moved aside to ``history.sqlite.corrupt`` and rebuilt;
    - a history folded from another records database (``monitor.sqlite`` deleted or
      replaced: ``_reconcile``) is rebuilt, and the history of runs the records do not
      know is dropped, so no chart shows a run that does not exist and none is hidden.

    ``problem()`` is what ``/readyz`` reports for it: None while it works; the thread
    stopped, a fold that keeps failing, or a storage failure that outlasts
    ``REPORT_AFTER`` retries.
    """

    BATCH = 100
    DUTY = 0.1

    def __init__(self, records_db: Path, history_db: Path, ema_alpha: float,
                 default_warmup: int, interval: float = 0.2, max_names: int = MAX_NAMES,
                 on_skip: Callable[[], None] | None = None) -> None:
        self.records_db, self.history_db = records_db, history_db
        self.max_names = max_names
        self.ema_alpha, self.default_warmup = ema_alpha, default_warmup
        self.interval = interval
        self.skipped = 0
        self._on_skip = on_skip
        self._db: History | None = None
        self._checked = False
        self._noted = True  # catch_up notes the source only after _reconcile found none
        # run id -> the latest attempt whose records were judged for a refold (settled, and
        # folded again if it replaced history): its other records then ask no database.
        self._judged: dict[str, int] = {}
        self._failure: str | None = None
        self._repair = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="history", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def request_repair(self) -> None:
        """A reader found the history corrupt: the thread moves it aside and rebuilds."""
        self._repair.set()

    def problem(self) -> str | None:
        """Why the charts cannot keep up now, or None (the thread alive and folding)."""
        if self._thread.ident is not None and not self._thread.is_alive() \
                and not self._stop.is_set():
            return "chart history: its thread stopped; the sidecar's log has why"
        if self._failure is not None:
            return f"chart history: {self._failure}"
        return None

    def _loop(self) -> None:
        # Opened here, not in the app's startup: a history that cannot be written (a full
        # disk) costs the charts, never the sidecar's readiness.
        src, last_error, failures = None, None, 0
        try:
            while not self._stop.is_set():
                try:
                    if self._repair.is_set():
                        self._rebuild("a reader found it corrupt")
                    if src is None:
                        self._open()
                        conn = self._records()
                        try:
                            self._reconcile(conn)
                        except BaseException:
                            conn.close()
                            raise
                        src = conn
                    started = time.perf_counter()
                    busy = self.catch_up(src)
                    spent = time.perf_counter() - started
                except StorageError as exc:
                    if exc.corrupt and exc.source == HISTORY_SOURCE:
                        self._rebuild(str(exc))
                        continue
                    if str(exc) != last_error:  # once per cause, not every retry
                        log.warning("chart history: %s; retrying every %g s", exc, RETRY_S)
                    last_error, busy = str(exc), False
                    failures += 1
                    if failures >= REPORT_AFTER:
                        self._failure = f"{exc}; retrying every {RETRY_S:g} s"
                    self._stop.wait(RETRY_S)
                    continue
                except Exception as exc:  # a bug: reported in /readyz, retried, never fatal
                    log.exception("chart history: the fold failed; retrying every %g s", RETRY_S)
                    self._failure = f"the fold failed ({type(exc).__name__}: {exc}); retrying"
                    self._fresh_builder()
                    self._stop.wait(RETRY_S)
                    continue
                last_error, self._failure, failures = None, None, 0
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
            self._close()

    def _open(self) -> None:
        if self._db is None:
            self._db = open_history(self.history_db)
            self.builder = HistoryBuilder(self._db, self.ema_alpha, self.default_warmup,
                                          self.max_names)
            if not self._checked:  # once per process: it reads the whole file
                self._checked = True
                self._quick_check()

    def _quick_check(self) -> None:
        assert self._db is not None
        self._db.check_integrity()

    def _fresh_builder(self) -> None:
        """Forget the builder's per-run caches: they are reloaded from the tables."""
        self._judged.clear()
        if self._db is not None:
            self.builder = HistoryBuilder(self._db, self.ema_alpha, self.default_warmup,
                                          self.max_names)

    def _close(self) -> None:
        self._judged.clear()
        if self._db is not None:
            self._db.close()  # checkpointed: the history file alone is complete after a stop
            self._db = None

    def _rebuild(self, why: str) -> None:
        """Move the history aside (kept for a post-mortem, one generation) and start over
        from the records."""
        self._repair.clear()
        try:
            self._close()
        except StorageError:
            self._db = None  # a corrupt file may refuse even that; it is moved aside anyway
        aside = self.history_db.with_name(self.history_db.name + ".corrupt")
        for suffix in ("", "-wal", "-shm"):
            path = Path(str(self.history_db) + suffix)
            try:
                os.replace(path, Path(str(aside) + suffix))
            except FileNotFoundError:
                pass
            except OSError as exc:
                log.error("chart history: cannot move %s aside: %s", path, exc)
        log.warning("chart history %s is corrupt (%s): moved to %s, rebuilding it from the "
                    "records", self.history_db, why, aside)
        self._checked = True  # the new file is empty: nothing to check
        self._noted = False  # nor does it know its source yet: catch_up notes it

    @storage_errors(source=HISTORY_SOURCE)
    def _reconcile(self, src: Database) -> None:
        """Make the history a copy of these records: rebuilt when it was folded from
        another records database, without the runs these records do not know.

        Which records database the history came from is its first run (``source``: run id
        and first-seen time; runs are never deleted, so it identifies the file for its
        whole life). A history from before that was noted is judged by its cursor: past
        the newest record id means the records were replaced."""
        assert self._db is not None
        row = self._db.execute("SELECT last_id FROM cursor").fetchone()
        cursor = row[0] if row else 0
        noted = self._db.execute("SELECT run_id, first_seen FROM source").fetchone()
        with storage_errors(source="storage"):
            newest = src.execute("SELECT COALESCE(MAX(id), 0) FROM records").fetchone()[0]
            first = _first_run(src)
            known = {r[0] for r in src.execute("SELECT run_id FROM runs")}
        replaced = (first != tuple(noted)) if noted is not None else cursor > newest
        if replaced and (cursor or noted):
            log.warning("chart history was folded from another records database (first "
                        "run %s, record %d folded; these records: first run %s, newest "
                        "record %d); rebuilding the history", noted and noted[0], cursor,
                        first and first[0], newest)
            self._close()
            for suffix in ("", "-wal", "-shm"):
                Path(str(self.history_db) + suffix).unlink(missing_ok=True)
            self._open()
            self._note_source(first)
            return
        if noted is None:
            self._note_source(first)
        unknown = [r for r in _history_runs(self._db) if r not in known]
        if unknown:
            log.warning("chart history: dropping %d runs the records do not know (%s)",
                        len(unknown), ", ".join(unknown[:5]))
            with self._db.tx() as db:
                for table in HISTORY_TABLES:
                    db.executemany(f"DELETE FROM {table} WHERE run_id = ?",
                                   [(r,) for r in unknown])
            self._fresh_builder()

    def _note_source(self, first: tuple[str, float] | None) -> None:
        """Remember which records database this history is folded from (once it has a
        run; until then ``catch_up`` tries again)."""
        assert self._db is not None
        if first is not None:
            self._db.execute("INSERT OR REPLACE INTO source VALUES (0, ?, ?)", first)
        self._noted = first is not None

    def _records(self) -> Database:
        """The read-only connection to the sidecar's records."""
        return Database(self.records_db, (), readonly=True)

    def catch_up(self, src: Database) -> bool:
        """Fold one batch of new records; True when there may be more (StorageError when
        either database fails, its ``source`` saying which). A record the fold cannot take
        is skipped, the batch folded again one record at a time around it."""
        self._open()
        assert self._db is not None
        with storage_errors(source=HISTORY_SOURCE):
            row = self._db.execute("SELECT last_id FROM cursor").fetchone()
        last = row[0] if row else 0
        with storage_errors(source="storage"):
            rows = src.execute(
                "SELECT id, body, run_id, attempt, superseded_by FROM records WHERE id > ? "
                "AND kind != 'end' ORDER BY id LIMIT ?", (last, self.BATCH)).fetchall()
        if not rows:
            return False
        if not self._noted:
            with storage_errors(source="storage"):
                first = _first_run(src)
            with storage_errors(source=HISTORY_SOURCE):
                self._note_source(first)
        try:
            for row in rows:
                self._fold(src, row)
            self.builder.commit(rows[-1][0])
        except StorageError:
            self._fresh_builder()
            raise
        except Exception:
            self._one_by_one(src, rows)
        return len(rows) == self.BATCH

    def _fold(self, src: Database, row: tuple[int, bytes, str, int, int | None]
              ) -> None:
        """Fold one stored record: none a later attempt replaced; a record of an attempt
        that replaced part of its run's history first folds that run again from what is
        left (pipeline/attempts.py), so the charts draw the current history."""
        row_id, body, run_id, attempt, superseded_by = row
        if superseded_by is not None:
            return
        replaced = self._replaces_history(src, run_id, attempt) if attempt > 1 else None
        if replaced is not None:
            self.builder.commit()
            self.branch(src, run_id, attempt, replaced)
            self._refold(src, run_id, row_id, attempt)
        self.builder.add(wire.loads(body))

    def _one_by_one(self, src: Database,
                    rows: list[tuple[int, bytes, str, int, int | None]]) -> None:
        """Fold and commit each record alone, so the one that fails is the only one lost
        (a fresh builder each time: a failed fold may have half-updated its caches)."""
        for row in rows:
            row_id = row[0]
            self._fresh_builder()
            try:
                self._fold(src, row)
                self.builder.commit(row_id)
            except StorageError:
                self._fresh_builder()
                raise
            except Exception as exc:
                self._skipped(f"record {row_id}", exc)
                self._fresh_builder()
                self.builder.commit(row_id)  # past it: nothing of it was written

    def _skipped(self, what: str, exc: Exception) -> None:
        self.skipped += 1
        if self._on_skip is not None:
            self._on_skip()
        log.warning("chart history: %s skipped (%s: %s)", what, type(exc).__name__,
                    str(exc)[:200])

    def _replaces_history(self, src: Database, run_id: str, attempt: int
                          ) -> tuple[str, int, int, int] | None:
        """(kind, start step, first and last step replaced) when ``attempt`` is settled,
        replaced some of the run's history, and its history was not folded again for it
        yet; else None."""
        if attempt <= self._judged.get(run_id, 1):
            return None
        assert self._db is not None
        row = self._db.execute("SELECT number FROM attempts WHERE run_id = ?",
                               (run_id,)).fetchone()
        folded = row[0] if row else 1
        if attempt <= folded:
            self._judged[run_id] = folded
            return None
        found = src.execute("SELECT kind, start_step, superseded_from, superseded_to FROM "
                            "attempts WHERE run_id = ? AND number = ?",
                            (run_id, attempt)).fetchone()
        if found is None or found[0] == "pending":
            return None  # not settled yet: its next record asks again
        self._judged[run_id] = attempt
        return None if found[2] is None else found

    def branch(self, src: Database, run_id: str, attempt: int,
               replaced: tuple[str, int, int, int]) -> None:
        """Keep what ``attempt`` abandoned as a branch, in one transaction (done again
        after a crash before the refold, it writes the same rows): the step records it
        replaced, every ``stride``-th step and the last, per rank; their loss and grad
        norm. A restart replaced a whole other run: its branches go, none is kept."""
        assert self._db is not None
        kind, start, lo, hi = replaced
        stride = max(1, -(-(hi - lo + 1) // MAX_BRANCH_POINTS))
        with storage_errors(source="storage"):
            rows = [] if kind == "restarted" else src.execute(
                "SELECT id, rank, step, body FROM records WHERE run_id = ? AND kind = 'step' "
                "AND superseded_by = ? AND step BETWEEN ? AND ? AND ((step - ?) % ? = 0 OR "
                "step = ?)", (run_id, attempt, lo, hi, lo, stride, hi)).fetchall()
        points = []
        for row_id, rank, step, body in rows:
            try:
                obj = wire.loads(body)
                points.append((run_id, attempt, rank, step, _num(obj.get("loss")),
                               _num(obj.get("grad_norm"))))
            except Exception as exc:  # stored but odd: that point is left out
                self._skipped(f"record {row_id} (abandoned branch)", exc)
        with self._db.tx() as db:
            if kind == "restarted":
                for table in BRANCH_TABLES:
                    db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
                return
            db.execute("INSERT OR REPLACE INTO branches VALUES (?, ?, ?)",
                       (run_id, attempt, start - 1))
            db.executemany("INSERT OR REPLACE INTO branch_steps VALUES (?,?,?,?,?,?)", points)

    def _refold(self, src: Database, run_id: str, before_id: int,
                attempt: int) -> None:
        """The run's history folded again from its current history before ``before_id``."""
        assert self._db is not None
        self.builder.forget(run_id)
        with storage_errors(source="storage"):
            cursor = src.execute(
                "SELECT id, body FROM records WHERE run_id = ? AND id < ? AND superseded_by "
                "IS NULL AND kind != 'end' ORDER BY id", (run_id, before_id))
            chunks = iter(lambda: cursor.fetchmany(self.BATCH), [])
        for chunk in chunks:
            for row_id, body in chunk:
                try:
                    self.builder.add(wire.loads(body))
                except StorageError:
                    raise
                except Exception as exc:  # stored but odd: skipped, as catch_up skips it
                    self._skipped(f"record {row_id} (folded again)", exc)
            self.builder.commit()
        with storage_errors(source=HISTORY_SOURCE):
            self._db.execute("INSERT OR REPLACE INTO attempts VALUES (?, ?)", (run_id, attempt))


def _num(value: object) -> float | None:
    """A stored number as a branch keeps it; a non-finite one is no value (a gap)."""
    value = wire.nonfinite_to_float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _first_run(src: Database) -> tuple[str, float] | None:
    """The records database's first run (its identity, see ``_reconcile``), or None."""
    row = src.execute("SELECT run_id, first_seen FROM runs ORDER BY rowid LIMIT 1").fetchone()
    return (row[0], row[1]) if row else None


def _history_runs(db: History) -> list[str]:
    """The run ids the history holds, by skipping through the steps' primary key (one
    index seek per run, not a scan of every step) plus the runs table."""
    found = {r[0] for r in db.execute("SELECT run_id FROM runs")}
    row = db.execute("SELECT MIN(run_id) FROM steps").fetchone()
    while row is not None and row[0] is not None:
        found.add(row[0])
        row = db.execute("SELECT MIN(run_id) FROM steps WHERE run_id > ?", (row[0],)).fetchone()
    return sorted(found)
