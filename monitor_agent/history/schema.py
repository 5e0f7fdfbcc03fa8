"""The chart history's database: its schema, as migrations, and ``open_history``.

One SQLite file beside the records (``data_dir / "history.sqlite"``), opened through the
storage helper (``storage/database.py``: its pragmas, its migrations, ``StorageError``
named ``HISTORY_SOURCE``). The indexer thread writes it; each chart request reads it on a
read-only connection of its own; the report folds a trace into one in memory::

    >>> db = open_history(":memory:")
    >>> db.query("PRAGMA user_version")[0][0] == len(MIGRATIONS)
    True
    >>> db.query("SELECT COUNT(*) FROM steps")
    [(0,)]
    >>> db.close()
"""

from __future__ import annotations

from pathlib import Path
from typing import TypeAlias

from monitor_agent.history.blocks import SCALARS
from monitor_agent.storage.database import Database

HISTORY_SOURCE = "chart history"
"""How its ``StorageError``s name it: readiness repairs this one instead of giving up."""

_BLOCK_COLS = ", ".join(f"{c}_min REAL, {c}_max REAL, {c}_sum REAL, {c}_n INTEGER"
                        for c in SCALARS)

# The schema as the history had it before it was versioned. IF NOT EXISTS: a file written
# then (user_version 0, every table there) takes this migration as a no-op and opens as it was.
_V1 = f"""
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
    {", ".join(f"{c} REAL" for c in SCALARS)},
    PRIMARY KEY (run_id, rank, step)) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS steps_nonfinite ON steps (run_id, rank, step) WHERE nonfinite != 0;
CREATE TABLE IF NOT EXISTS step_blocks (
    run_id TEXT, rank INTEGER, level INTEGER, block INTEGER, n INTEGER, step_sum REAL,
    {_BLOCK_COLS},
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

MIGRATIONS: tuple[str, ...] = (_V1,)
"""``MIGRATIONS[i]`` takes the history from ``PRAGMA user_version`` i to i + 1."""

RUN_TABLES = ("runs", "names", "ema", "steps", "step_blocks", "matrix_blocks", "evals",
              "user_scalars", "user_blocks", "matrices")
"""Every table holding a run's history, keyed by run id (``attempts`` says which attempt
it was folded for, and outlives a refold)."""

BRANCH_TABLES = ("branches", "branch_steps")
"""The abandoned branches of a run (``indexer.branch``): keyed by the resumed attempt that
abandoned each, kept across refolds, dropped when a restart replaces the whole run."""

HISTORY_TABLES = (*RUN_TABLES, "attempts", *BRANCH_TABLES)
"""Every table of the history keyed by run id."""

History: TypeAlias = Database
"""A chart history, as ``open_history`` gives it and ``series`` reads it."""


def open_history(path: Path | str, *, readonly: bool = False) -> History:
    """The history database, migrated (read-only: as it is, and it must exist)."""
    return Database(path, MIGRATIONS, source=HISTORY_SOURCE, readonly=readonly)
