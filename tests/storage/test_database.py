"""database.Database: migrations by user_version, one transaction helper, the lock."""

from __future__ import annotations

import ast
import re
import sqlite3
import threading
from pathlib import Path

import pytest

import monitor_agent
from monitor_agent.storage.database import Database, StorageError, storage_errors
from tests.eventually import eventually

TX_SQL = re.compile(r"(BEGIN|COMMIT|ROLLBACK|END TRANSACTION|SAVEPOINT|RELEASE)\b")
V1 = ("CREATE TABLE t (x INTEGER);",)
V2 = (*V1, "ALTER TABLE t ADD COLUMN y TEXT;")


def test_migrations_run_once_each_by_user_version(tmp_path: Path):
    db = Database(tmp_path / "d.sqlite", V1)
    db.execute("INSERT INTO t VALUES (1)")
    db.close()
    db = Database(tmp_path / "d.sqlite", V2)  # only the second script runs now
    assert db.query("PRAGMA user_version")[0][0] == 2
    assert db.query("SELECT x, y FROM t") == [(1, None)]
    db.close()
    assert Database(tmp_path / "d.sqlite", V2).query("SELECT COUNT(*) FROM t")[0][0] == 1


def test_a_migration_that_fails_halfway_changes_nothing_and_runs_whole_again(tmp_path: Path):
    half = (*V1, "ALTER TABLE t ADD COLUMN y TEXT; INSERT INTO nowhere VALUES (1);")
    Database(tmp_path / "d.sqlite", V1).close()
    with pytest.raises(StorageError, match="nowhere"):
        Database(tmp_path / "d.sqlite", half)
    db = Database(tmp_path / "d.sqlite", V2)  # not "duplicate column y": nothing was kept
    assert db.query("PRAGMA user_version")[0][0] == 2
    assert [row[1] for row in db.query("PRAGMA table_info(t)")] == ["x", "y"]
    db.close()


def test_pragmas_wal_and_normal_sync(tmp_path: Path):
    db = Database(tmp_path / "d.sqlite", V1, busy_timeout_ms=1234)
    assert db.query("PRAGMA journal_mode")[0][0] == "wal"
    assert db.query("PRAGMA synchronous")[0][0] == 1  # NORMAL
    assert db.query("PRAGMA busy_timeout")[0][0] == 1234


def test_a_read_only_database_reads_as_it_is_and_writes_nothing(tmp_path: Path):
    """``readonly``: a reader beside the writer (a chart request, the history's indexer
    reading the records) sees the file unmigrated and cannot change it; a missing file is
    an error, not a new database."""
    path = tmp_path / "d.sqlite"
    writer = Database(path, V1)
    writer.execute("INSERT INTO t VALUES (1)")
    reader = Database(path, V2, readonly=True, source="chart history")
    assert reader.query("SELECT * FROM t") == [(1,)]  # V2 not applied: the writer migrates
    assert reader.query("PRAGMA user_version") == [(1,)]
    with pytest.raises(StorageError, match="readonly") as caught:
        reader.execute("INSERT INTO t VALUES (2)")
    assert caught.value.source == "chart history"
    reader.close()
    writer.close()
    with pytest.raises(StorageError):
        Database(tmp_path / "absent.sqlite", V1, readonly=True)
    assert not (tmp_path / "absent.sqlite").exists()


def test_tx_commits_together_or_not_at_all(tmp_path: Path):
    db = Database(tmp_path / "d.sqlite", V1, row_factory=sqlite3.Row)
    with db.tx() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (2)")
    with pytest.raises(RuntimeError), db.tx() as conn:
        conn.execute("INSERT INTO t VALUES (3)")
        raise RuntimeError("half way")
    assert [r["x"] for r in db.query("SELECT x FROM t ORDER BY x")] == [1, 2]
    with db.tx() as conn:  # the failed one left no transaction open
        conn.execute("INSERT INTO t VALUES (4)")
    assert len(db.query("SELECT x FROM t")) == 3


def test_failed_write_rolls_back_and_raises_sqlite_error(tmp_path: Path):
    db = Database(tmp_path / "d.sqlite", V1)
    db.execute("PRAGMA query_only = ON")
    # The storage boundary: the SQLite error comes out as StorageError, chained as its cause.
    with pytest.raises(StorageError) as caught:
        db.check_writable()
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    db.execute("PRAGMA query_only = OFF")
    db.check_writable()


def test_threadsafe_database_serializes_transactions(tmp_path: Path):
    db = Database(tmp_path / "d.sqlite", ("CREATE TABLE n (v INTEGER); INSERT INTO n VALUES (0);",),
                  threadsafe=True)

    def bump() -> None:
        for _ in range(50):
            with db.tx() as conn:
                (v,) = conn.execute("SELECT v FROM n").fetchone()
                conn.execute("UPDATE n SET v = ?", (v + 1,))

    threads = [threading.Thread(target=bump) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db.query("SELECT v FROM n")[0][0] == 200


def test_transaction_statements_are_written_only_in_database_py():
    """BEGIN / COMMIT / ROLLBACK live in one place; everything else uses ``tx()``."""
    root = Path(monitor_agent.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.relative_to(root).as_posix() in {"storage/database.py"}:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            text = node.value if isinstance(node, ast.Constant) else None
            if isinstance(text, str) and TX_SQL.match(text.strip()):
                offenders.append(f"{path.relative_to(root)}: {text!r}")
    assert offenders == []


def test_a_statement_failing_inside_tx_leaves_as_storage_error(tmp_path: Path):
    """The body of ``tx()`` is behind the boundary too: its SQL error comes out converted,
    with the database's ``source``, and the transaction rolled back."""
    db = Database(tmp_path / "d.sqlite", ("CREATE TABLE t (x INTEGER NOT NULL);",),
                  source="alert storage")
    with pytest.raises(StorageError) as caught, db.tx() as conn:
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("INSERT INTO t VALUES (NULL)")
    assert isinstance(caught.value.__cause__, sqlite3.IntegrityError)
    assert str(caught.value) == str(caught.value.__cause__)
    assert caught.value.source == "alert storage"
    assert db.query("SELECT COUNT(*) FROM t")[0][0] == 0


def test_a_full_database_raises_storage_error(tmp_path: Path):
    db = Database(tmp_path / "d.sqlite", ("CREATE TABLE t (b BLOB);",))
    db.execute("PRAGMA max_page_count = 8")  # a tiny disk: writes past 8 pages fail
    with pytest.raises(StorageError, match="full") as caught, db.tx() as conn:
        for _ in range(64):
            conn.execute("INSERT INTO t VALUES (?)", (b"x" * 4096,))
    assert isinstance(caught.value.__cause__, sqlite3.OperationalError)


def test_storage_errors_adds_context_and_keeps_the_sqlite_cause():
    cause = sqlite3.OperationalError("disk I/O error")
    with pytest.raises(StorageError) as caught, storage_errors("cannot write"):
        raise cause
    assert str(caught.value) == "cannot write: disk I/O error" and caught.value.__cause__ is cause
    # From below, already converted: the context is added, the cause stays SQLite's.
    with pytest.raises(StorageError) as again, storage_errors("cannot store records"):
        raise StorageError("disk I/O error", source="alert storage") from cause
    assert str(again.value) == "cannot store records: disk I/O error"
    assert again.value.__cause__ is cause and again.value.source == "alert storage"
    with pytest.raises(KeyError), storage_errors("cannot write"):  # not ours: untouched
        raise KeyError("x")


@pytest.mark.parametrize("name", ["run #1", "what?mode=rw", "100%25 done"])
def test_a_data_dir_with_uri_characters_serves_charts_and_exports(tmp_path: Path, name: str):
    """``#``, ``?`` and ``%`` in the data directory's path are path characters, not URI
    syntax: the read-only connections (charts' indexer, chart reads, export) open the very
    files, and nothing is created outside the data directory."""

    import httpx

    from monitor_agent.settings import load_settings
    from monitor_agent.storage.export import export_from_data_dir
    from tests.live_server import LiveServer

    parent = tmp_path / "parent"
    parent.mkdir()
    data = parent / name
    steps = [{"kind": "step", "run_id": "r", "step": s, "time": 1.0 + s, "loss": 2.0}
             for s in range(1, 21)]
    with LiveServer(load_settings(data_dir=data)) as srv:
        assert httpx.post(srv.url + "/v1/records", json={"records": steps}).status_code == 200
        def indexed() -> None:
            res = httpx.get(srv.url + "/v1/runs/r/series", params={"points": 10})
            assert res.status_code == 200 and res.json()["range"] == [1, 20], res.text

        eventually(indexed, timeout=20, interval=0.1, what="the chart history of r")
    out = tmp_path / "r.jsonl"
    assert export_from_data_dir(data, "r", out) == 20
    assert sorted(p.name for p in parent.iterdir()) == [name]
