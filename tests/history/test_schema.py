"""The chart history's database: a file the code before migrations wrote opens unchanged,
and a new file gets the very same schema."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from monitor_agent.history import series
from monitor_agent.history.builder import HistoryBuilder
from monitor_agent.history.schema import MIGRATIONS, open_history

# The schema as ui/history.py wrote it before the history had migrations (commit 820042a,
# its SCHEMA with the scalar columns filled in), copied verbatim: the test must not follow
# the code it checks.
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS cursor (id INTEGER PRIMARY KEY CHECK (id = 0), last_id INTEGER);
CREATE TABLE IF NOT EXISTS source (
    id INTEGER PRIMARY KEY CHECK (id = 0), run_id TEXT NOT NULL, first_seen REAL NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, warmup INTEGER, total_steps INTEGER, project TEXT);
CREATE TABLE IF NOT EXISTS names (
    run_id TEXT, space TEXT, names TEXT NOT NULL, PRIMARY KEY (run_id, space)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS ema (
    run_id TEXT, rank INTEGER, raw REAL, n INTEGER, PRIMARY KEY (run_id, rank)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS steps (
    run_id TEXT, rank INTEGER, step INTEGER, nonfinite INTEGER NOT NULL DEFAULT 0,
    loss REAL, loss_ema REAL, lr REAL, grad_norm REAL, clip_threshold REAL, update_ratio REAL, tokens_per_second REAL, mfu REAL, mem_allocated REAL, mem_reserved REAL, mem_peak REAL, step_time REAL, data_time REAL, loss_scale REAL,
    PRIMARY KEY (run_id, rank, step)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS steps_nonfinite ON steps (run_id, rank, step) WHERE nonfinite != 0;
CREATE TABLE IF NOT EXISTS step_blocks (
    run_id TEXT, rank INTEGER, level INTEGER, block INTEGER, n INTEGER, step_sum REAL,
    loss_min REAL, loss_max REAL, loss_sum REAL, loss_n INTEGER, loss_ema_min REAL, loss_ema_max REAL, loss_ema_sum REAL, loss_ema_n INTEGER, lr_min REAL, lr_max REAL, lr_sum REAL, lr_n INTEGER, grad_norm_min REAL, grad_norm_max REAL, grad_norm_sum REAL, grad_norm_n INTEGER, clip_threshold_min REAL, clip_threshold_max REAL, clip_threshold_sum REAL, clip_threshold_n INTEGER, update_ratio_min REAL, update_ratio_max REAL, update_ratio_sum REAL, update_ratio_n INTEGER, tokens_per_second_min REAL, tokens_per_second_max REAL, tokens_per_second_sum REAL, tokens_per_second_n INTEGER, mfu_min REAL, mfu_max REAL, mfu_sum REAL, mfu_n INTEGER, mem_allocated_min REAL, mem_allocated_max REAL, mem_allocated_sum REAL, mem_allocated_n INTEGER, mem_reserved_min REAL, mem_reserved_max REAL, mem_reserved_sum REAL, mem_reserved_n INTEGER, mem_peak_min REAL, mem_peak_max REAL, mem_peak_sum REAL, mem_peak_n INTEGER, step_time_min REAL, step_time_max REAL, step_time_sum REAL, step_time_n INTEGER, data_time_min REAL, data_time_max REAL, data_time_sum REAL, data_time_n INTEGER, loss_scale_min REAL, loss_scale_max REAL, loss_scale_sum REAL, loss_scale_n INTEGER,
    PRIMARY KEY (run_id, rank, level, block)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS matrix_blocks (
    run_id TEXT, rank INTEGER, stat TEXT, level INTEGER, block INTEGER, data BLOB NOT NULL,
    PRIMARY KEY (run_id, rank, stat, level, block)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS evals (
    run_id TEXT, rank INTEGER, step INTEGER, val_loss REAL, categories TEXT,
    PRIMARY KEY (run_id, rank, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS user_scalars (
    run_id TEXT, rank INTEGER, name INTEGER, step INTEGER, value REAL,
    PRIMARY KEY (run_id, rank, name, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS user_blocks (
    run_id TEXT, rank INTEGER, name INTEGER, level INTEGER, block INTEGER, n INTEGER,
    step_sum REAL, vmin REAL, vmax REAL, vsum REAL, vn INTEGER,
    PRIMARY KEY (run_id, rank, name, level, block)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS matrices (
    run_id TEXT, rank INTEGER, stat TEXT, step INTEGER, data BLOB NOT NULL,
    PRIMARY KEY (run_id, rank, stat, step)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS attempts (run_id TEXT PRIMARY KEY, number INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS branches (
    run_id TEXT, attempt INTEGER, to_step INTEGER NOT NULL,
    PRIMARY KEY (run_id, attempt)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS branch_steps (
    run_id TEXT, attempt INTEGER, rank INTEGER, step INTEGER, loss REAL, grad_norm REAL,
    PRIMARY KEY (run_id, attempt, rank, step)) WITHOUT ROWID;
"""


def _write_old_file(path: Path) -> None:
    """A history as the old ``open_history`` and ``HistoryBuilder`` left it: WAL, no
    ``user_version``, a run of three steps folded up to record 7."""
    db = sqlite3.connect(str(path), isolation_level=None)
    db.execute("PRAGMA journal_mode = WAL")
    db.execute("PRAGMA synchronous = NORMAL")
    db.executescript(OLD_SCHEMA)
    db.execute("INSERT INTO cursor VALUES (0, 7)")
    db.execute("INSERT INTO source VALUES (0, 'gpt-7', 1.5)")
    db.execute("INSERT INTO runs VALUES ('gpt-7', 10, 100, 'nano')")
    db.executemany("INSERT INTO steps (run_id, rank, step, loss) VALUES ('gpt-7', 0, ?, ?)",
                   [(1, 2.5), (2, 2.0), (3, 1.5)])
    db.close()


def _schema(db: sqlite3.Connection) -> list[tuple[str, str, str]]:
    return db.execute("SELECT type, name, sql FROM sqlite_master ORDER BY name").fetchall()


def test_a_history_the_old_code_wrote_opens_unchanged(tmp_path: Path):
    path = tmp_path / "history.sqlite"
    _write_old_file(path)
    before = sqlite3.connect(path)
    old_schema, old_steps = _schema(before), before.execute("SELECT * FROM steps").fetchall()
    assert before.execute("PRAGMA user_version").fetchone()[0] == 0
    before.close()

    # A chart request may read it before the indexer's open migrated it.
    reader = open_history(path, readonly=True)
    assert series.scalars(reader, "gpt-7")["series"]["loss"]["mean"] == [2.5, 2.0, 1.5]
    reader.close()

    db = open_history(path)
    assert db.query("PRAGMA user_version")[0][0] == len(MIGRATIONS)
    assert db.query("PRAGMA journal_mode")[0][0] == "wal"
    assert db.query("SELECT last_id FROM cursor") == [(7,)]  # the indexer resumes there
    assert db.query("SELECT * FROM source") == [(0, "gpt-7", 1.5)]
    assert db.query("SELECT * FROM steps") == old_steps
    # Folding goes on where the old code stopped.
    builder = HistoryBuilder(db)
    builder.add({"kind": "step", "run_id": "gpt-7", "step": 4, "time": 1.0, "loss": 1.0})
    builder.commit(last_id=8)
    assert series.scalars(db, "gpt-7")["series"]["loss"]["mean"] == [2.5, 2.0, 1.5, 1.0]
    db.close()

    after = sqlite3.connect(path)
    assert _schema(after) == old_schema
    after.close()
    again = open_history(path)  # migrated once: a second open changes nothing
    assert again.query("PRAGMA user_version")[0][0] == len(MIGRATIONS)
    again.close()


def test_a_new_history_has_the_old_codes_schema(tmp_path: Path):
    old = sqlite3.connect(tmp_path / "old.sqlite", isolation_level=None)
    old.executescript(OLD_SCHEMA)
    open_history(tmp_path / "new.sqlite").close()
    new = sqlite3.connect(tmp_path / "new.sqlite")
    assert _schema(new) == _schema(old)
    old.close()
    new.close()
