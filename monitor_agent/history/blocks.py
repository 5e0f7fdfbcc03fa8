"""Pre-aggregated blocks of the chart history: what makes a whole-run chart cheap.

Each level holds, per block of ``level`` steps, the min/max/sum/count of every scalar
(``step_blocks``) and of each scalar the script logged itself (``user_blocks``), and the
per-layer max of each layer statistic (``matrix_blocks``); each
level is rebuilt from the one below for the blocks a commit touched. A whole-run chart of
200,000 steps in 1,000 buckets then reads 3,125 blocks of 64 instead of 200,000 rows.

``HistoryBuilder.commit`` (builder.py) calls both for the level-16 blocks its rows fall in,
as ``(run_id, rank, block)`` and ``(run_id, rank, stat, block)``. A run of 100 steps with a
spike at step 37, whose blocks are then rebuilt once the spike is gone::

    >>> from monitor_agent.history.builder import HistoryBuilder
    >>> from monitor_agent.history.schema import open_history
    >>> db = open_history(":memory:")
    >>> builder = HistoryBuilder(db)
    >>> for step in range(1, 101):
    ...     builder.add({"kind": "step", "run_id": "gpt-7", "step": step, "time": 1.0,
    ...                  "loss": 9.0 if step == 37 else 2.0})
    >>> builder.commit()
    >>> levels = "SELECT level, COUNT(*), SUM(n), MAX(loss_max) FROM step_blocks GROUP BY level"
    >>> db.execute(levels).fetchall()
    [(16, 7, 100, 9.0), (64, 2, 100, 9.0), (256, 1, 100, 9.0)]
    >>> _ = db.execute("UPDATE steps SET loss = 2.0 WHERE step = 37")
    >>> with db.tx() as conn:   # block 2 of level 16 changed
    ...     aggregate_steps(conn, {("gpt-7", 0, 37 // 16)})
    >>> db.execute(levels).fetchall()
    [(16, 7, 100, 2.0), (64, 2, 100, 2.0), (256, 1, 100, 2.0)]
    >>> db.close()
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from monitor_agent.history import vectors
from monitor_agent.storage.database import Connection

SCALARS: tuple[str, ...] = (
    "loss", "loss_ema", "lr", "grad_norm", "clip_threshold", "update_ratio",
    "tokens_per_second", "mfu", "mem_allocated", "mem_reserved", "mem_peak", "step_time",
    "data_time", "loss_scale",
)
"""Per-step columns, in table order."""

BLOCK_LEVELS: tuple[int, ...] = (16, 64, 256)
"""Steps per block, finest first."""

BLOCKED_MATRICES: tuple[str, ...] = ("grad_norm", "update_ratio", "act_max_abs", "act_zero_frac")
"""Per-layer statistics kept in blocks (the max per layer). Gradient quantiles are not:
they are recorded every ``hist_every`` steps, few enough to read as stored."""


def _by_level(touched: set[tuple]) -> Iterator[tuple[int, int | None, tuple, int, int]]:
    """Every touched block of every level, finest first, as ``(level, below, key, first,
    last)``: ``key`` ends with the block's index, ``below`` is the level it is rebuilt from
    (None: the rows themselves) and ``first..last`` the steps, or the blocks of ``below``,
    it covers. A touched block's parent one level up is touched too."""
    below = None
    for level in BLOCK_LEVELS:
        if below is not None:
            touched = {(*key[:-1], key[-1] * below // level) for key in touched}
        unit = below or 1
        for key in touched:
            yield level, below, key, key[-1] * level // unit, (key[-1] + 1) * level // unit - 1
        below = level


def aggregate_steps(db: Connection, blocks: set[tuple[str, int, int]]) -> None:
    """Recompute the touched blocks of every level from the level below (or the steps)."""
    for level, below, (run_id, rank, block), first, last in _by_level(blocks):
        source = () if below is None else (below,)
        db.execute(_block_sql(level, below),
                   (run_id, rank, level, block, run_id, rank, *source, first, last))


def _block_sql(level: int, below: int | None) -> str:
    """INSERT OR REPLACE one block, aggregated from the steps or from the level below."""
    if below is None:
        aggs = ", ".join(f"MIN({c}), MAX({c}), SUM({c}), COUNT({c})" for c in SCALARS)
        return (f"INSERT OR REPLACE INTO step_blocks SELECT ?, ?, ?, ?, COUNT(*), SUM(step), "
                f"{aggs} FROM steps WHERE run_id=? AND rank=? AND step BETWEEN ? AND ?")
    aggs = ", ".join(f"MIN({c}_min), MAX({c}_max), SUM({c}_sum), SUM({c}_n)" for c in SCALARS)
    return (f"INSERT OR REPLACE INTO step_blocks SELECT ?, ?, ?, ?, SUM(n), SUM(step_sum), "
            f"{aggs} FROM step_blocks WHERE run_id=? AND rank=? AND level=? "
            "AND block BETWEEN ? AND ?")


def aggregate_user(db: Connection, touched: set[tuple[str, int, int, int]]) -> None:
    """Recompute the touched level-16 blocks of the script's own scalars and the levels
    above: ``(run_id, rank, name index, block)``. A run logging accuracy every step for
    200,000 steps is then read in blocks too, not row by row."""
    for level, below, (run_id, rank, name, block), first, last in _by_level(touched):
        key = (run_id, rank, name, level, block, run_id, rank, name)
        if below is None:
            db.execute("INSERT OR REPLACE INTO user_blocks SELECT ?, ?, ?, ?, ?, COUNT(*), "
                       "SUM(step), MIN(value), MAX(value), SUM(value), COUNT(value) FROM "
                       "user_scalars WHERE run_id=? AND rank=? AND name=? AND step BETWEEN "
                       "? AND ?", (*key, first, last))
        else:
            db.execute("INSERT OR REPLACE INTO user_blocks SELECT ?, ?, ?, ?, ?, SUM(n), "
                       "SUM(step_sum), MIN(vmin), MAX(vmax), SUM(vsum), SUM(vn) FROM "
                       "user_blocks WHERE run_id=? AND rank=? AND name=? AND level=? AND "
                       "block BETWEEN ? AND ?", (*key, below, first, last))


def aggregate_matrices(db: Connection, touched: set[tuple[str, int, str, int]]) -> None:
    """Recompute the per-layer max of the touched level-16 blocks and the levels above."""
    for level, below, (run_id, rank, stat, block), first, last in _by_level(touched):
        if below is None:
            rows = db.execute(
                "SELECT data FROM matrices WHERE run_id=? AND rank=? AND stat=? AND step "
                "BETWEEN ? AND ?", (run_id, rank, stat, first, last)).fetchall()
        else:
            rows = db.execute(
                "SELECT data FROM matrix_blocks WHERE run_id=? AND rank=? AND stat=? AND "
                "level=? AND block BETWEEN ? AND ?",
                (run_id, rank, stat, below, first, last)).fetchall()
        if rows:
            db.execute("INSERT OR REPLACE INTO matrix_blocks VALUES (?,?,?,?,?,?)",
                       (run_id, rank, stat, level, block, _fmax(r[0] for r in rows)))


def _fmax(blobs) -> bytes:
    """Element-wise max of float32 vectors of growing length (NaN only where all are)."""
    dense = [vectors.decode(b) for b in blobs]
    out = np.full(max(len(v) for v in dense), np.nan, dtype=np.float32)
    for v in dense:
        np.fmax(out[:len(v)], v, out=out[:len(v)])
    return vectors.encode(out)
