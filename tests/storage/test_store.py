"""SQLite store: idempotent inserts, retention, recovery reads, refusing when unwritable."""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from pathlib import Path

import pytest

from monitor_agent.records import wire
from monitor_agent.storage import store as store_module
from monitor_agent.storage.database import StorageError
from monitor_agent.storage.store import RecordRow, Store, StoredAttempt


def _row(step: int, run_id: str = "r", kind: str = "step", rank: int = 0) -> RecordRow:
    return RecordRow(run_id, rank, kind, step, float(step), b'{"step": %d}' % step)


def test_duplicates_are_reported_not_stored_twice(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    first = store.insert_records([_row(1), _row(2)])
    again = store.insert_records([_row(2), _row(3)])
    assert all(first) and again[0] is None and again[1] is not None
    assert store.records("r") == [b'{"step": 1}', b'{"step": 2}', b'{"step": 3}']


def test_ranks_and_kinds_are_separate_keys(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    ids = store.insert_records([_row(1), _row(1, rank=1), _row(1, kind="eval")])
    assert None not in ids


def test_prune_keeps_the_newest_steps(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    store.insert_records([_row(s) for s in range(1, 11)] + [_row(5, kind="eval")])
    assert store.prune("r", 0, through_step=5, limit=2) == 2  # oldest first, bounded
    assert store.prune("r", 0, through_step=7) == 5
    assert store.records("r", kinds=("step",)) == [b'{"step": %d}' % s for s in (8, 9, 10)]
    assert store.records("r", kinds=("eval",)) == [b'{"step": 5}']


def test_state_survives_reopening(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    store.insert_records([_row(1), _row(2)])
    store.save_detector_state("r", 1, b'{"x": 1}')
    store.close()
    again = Store(tmp_path / "m.sqlite")
    assert again.detector_state("r") == (1, b'{"x": 1}')
    assert [row[0] for row in again.records_after("r", 1)] == [2]
    assert again.run_row("r").status == "running"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
@pytest.mark.allowed_skip("nothing to install: root (CI) reads and writes any file")
def test_read_only_store_refuses_writes(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    store.close()
    os.chmod(tmp_path / "m.sqlite", 0o444)
    ro = Store(tmp_path / "m.sqlite")
    with pytest.raises(StorageError):
        ro.insert_records([_row(1)])


def test_query_only_store_refuses_writes(tmp_path: Path):
    # Works as root too: SQLite's own read-only switch stands in for a read-only disk.
    store = Store(tmp_path / "m.sqlite")
    store._db.execute("PRAGMA query_only = ON")
    with pytest.raises(StorageError):
        store.insert_records([_row(1)])
    with pytest.raises(StorageError):
        store.check_writable()
    assert store.records("r") == []


def test_a_full_disk_is_a_storage_error_with_the_sqlite_error_as_its_cause(tmp_path: Path):
    # max_bytes sets PRAGMA max_page_count: past it SQLite fails exactly as on a full disk.
    store = Store(tmp_path / "m.sqlite", max_bytes=64 * 1024)
    big = [RecordRow("r", 0, "step", s, None, b"x" * 4000) for s in range(100)]
    with pytest.raises(StorageError) as caught:
        store.insert_records(big)
    cause = caught.value.__cause__
    assert isinstance(cause, sqlite3.OperationalError)
    assert str(caught.value) == f"cannot store records: {cause}"  # the message, kept
    assert "full" in str(cause) and caught.value.source == "storage"
    assert store.records("r") == []  # the transaction rolled back as a whole


def test_reads_of_a_closed_store_are_storage_errors(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    store.close()
    with pytest.raises(StorageError) as caught:
        store.runs()
    assert isinstance(caught.value.__cause__, sqlite3.ProgrammingError)


def test_a_database_from_before_attempts_keeps_its_records_as_attempt_1(tmp_path: Path):
    path = tmp_path / "monitor.sqlite"
    db = sqlite3.connect(path)
    db.executescript(store_module._MIGRATIONS[0])
    db.execute("PRAGMA user_version = 1")
    db.execute("INSERT INTO runs VALUES ('old', NULL, 'completed', 5.0, 6.0, 6.0)")
    db.execute("INSERT INTO detector_state VALUES ('old', 2, X'7B7D', 6.0)")
    for step in (3, 4):
        db.execute("INSERT INTO records (run_id, rank, kind, step, time, body) VALUES "
                   "('old', 0, 'step', ?, 1.0, ?)",
                   (step, wire.dumps({"kind": "step", "run_id": "old", "step": step,
                                      "time": 1.0})))
    db.commit()
    db.close()

    store = Store(path)
    assert [(a.number, a.kind, a.start_step, a.first_step, a.last_step, a.steps)
            for a in store.attempts("old")] == [(1, "first", 3, 3, 4, 2)]
    assert store.run_row("old").last_step == 4
    assert store.detector_state("old") == (2, b"{}")
    assert store.attempt_tokens("old") == [("", 0, 1)]
    assert [wire.loads(b)["step"] for b in store.records("old")] == [3, 4]
    row = RecordRow("old", 0, "step", 4, 1.0, b'{"kind":"step","run_id":"old","step":4}')
    assert store.insert_records([row]) == [None]  # still a duplicate of attempt 1
    assert store.insert_records([dataclasses.replace(row, attempt=2)]) != [None]
    store.close()


def test_snapshots_thin_out_by_powers_of_two_and_a_resume_keeps_those_below_it():
    store = Store(":memory:")
    for step in range(100, 2001, 100):
        store.save_detector_state("r", step, b"%d" % step, max_step=step)
    kept = [step for (step,) in store._db.query(
        "SELECT max_step FROM detector_state WHERE run_id = 'r' ORDER BY max_step")]
    assert kept[-1] == 2000 and len(kept) <= 2 + (2000 - 100).bit_length()
    # Every distance back from the newest has a snapshot within a factor of two of it.
    for back in (100, 300, 700, 1500):
        below = [s for s in kept if s <= 2000 - back]
        assert below and 2000 - below[-1] <= 2 * back, (back, kept)

    store.add_attempt("r", 1, "a", 0, now=1.0)
    store.add_attempt("r", 2, "b", 0, now=2.0)
    store.settle_attempt("r", StoredAttempt(2, "resumed", 1500, 2.0, 1500, 2000))
    newest = store.detector_state("r")
    assert newest is not None and 1000 <= int(newest[1]) < 1500
    store.settle_attempt("r", StoredAttempt(2, "restarted", 1, 2.0, 1, 2000))
    assert store.detector_state("r") is None
    store.close()
