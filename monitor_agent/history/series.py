"""Downsampled reads of the chart history: what a chart of ``points`` pixels can show.

Scalars are bucketed in SQL (one pass over the step range, ``GROUP BY`` bucket) and keep
each bucket's min, max and mean, so a one-step spike stays visible however far out the
view is. Per-layer vectors are bucketed with numpy (max per bucket: a heatmap is read for
the layer that blew up, not for the average one). Where a range holds fewer steps than
``points`` the values come back as stored.
Every query raises ``StorageError`` when the history fails.

The chart endpoints read ``open_history(settings.data_dir / "history.sqlite",
readonly=True)``. A run of 100 steps with a one-step spike, drawn in 10 points::

    >>> from monitor_agent.history.builder import HistoryBuilder
    >>> from monitor_agent.history.schema import open_history
    >>> db = open_history(":memory:")
    >>> builder = HistoryBuilder(db)
    >>> for step in range(1, 101):
    ...     builder.add({"kind": "step", "run_id": "gpt-7", "step": step, "time": 1.0,
    ...                  "loss": 9.0 if step == 37 else 2.0})
    >>> builder.commit()
    >>> answer = scalars(db, "gpt-7", rank=0, points=10)
    >>> answer["bucketed"], answer["steps"]
    (True, [5, 15, 25, 35, 45, 55, 65, 75, 85, 95])
    >>> answer["series"]["loss"]["max"]
    [2.0, 2.0, 2.0, 9.0, 2.0, 2.0, 2.0, 2.0, 2.0, 2.0]
    >>> db.close()
"""

from __future__ import annotations

import base64
import math
from typing import Any

import numpy as np

from monitor_agent.detectors.support.phase import UPDATE_BANDS, phase_of
from monitor_agent.history import vectors
from monitor_agent.history.blocks import BLOCK_LEVELS, BLOCKED_MATRICES, SCALARS
from monitor_agent.history.builder import GUARD_SKIPPED, MATRICES, QUANTILE_WIDTH
from monitor_agent.history.schema import HISTORY_SOURCE, History
from monitor_agent.records import wire
from monitor_agent.storage.database import storage_errors

MAX_POINTS = 10_000

USER_CHARTS = 12
"""User scalars answered per series request (first logged first); the page names the rest."""

RECENT_STEPS = 64
"""Steps the header's throughput is the median of. Eval and checkpoint steps are slow
outliers (nanoGPT's eval step runs at a tenth of the rate) and fewer than half of any
64 consecutive steps, so the median is a training step's rate whichever step came last."""


def _clean(values: Any) -> list[float | None]:
    """JSON-safe floats: NaN/Inf (a bucket with no value) become null."""
    return [None if v is None or not math.isfinite(v) else float(v) for v in values]


@storage_errors(source=HISTORY_SOURCE)
def step_range(db: History, run_id: str, rank: int) -> tuple[int, int] | None:
    """First and last step of a rank: two index probes (a COUNT would read every row)."""
    where = "FROM steps WHERE run_id=? AND rank=? ORDER BY step"
    first = db.execute(f"SELECT step {where} LIMIT 1", (run_id, rank)).fetchone()
    if first is None:
        return None
    last = db.execute(f"SELECT step {where} DESC LIMIT 1", (run_id, rank)).fetchone()
    return first[0], last[0]


def _count(db: History, run_id: str, rank: int, lo: int, hi: int,
           points: int) -> int:
    """Steps stored in [lo, hi]: exact when few, from the coarsest blocks when many (a
    block straddling an end counts whole; only the bucketing decision depends on it)."""
    if hi - lo + 1 <= points:
        return db.execute("SELECT COUNT(*) FROM steps WHERE run_id=? AND rank=? AND step "
                          "BETWEEN ? AND ?", (run_id, rank, lo, hi)).fetchone()[0]
    level = block_level(lo, hi, points)
    if level is None:
        return db.execute("SELECT COUNT(*) FROM steps WHERE run_id=? AND rank=? AND step "
                          "BETWEEN ? AND ?", (run_id, rank, lo, hi)).fetchone()[0]
    return db.execute("SELECT COALESCE(SUM(n), 0) FROM step_blocks WHERE run_id=? AND rank=? "
                      "AND level=? AND block BETWEEN ? AND ?",
                      (run_id, rank, level, lo // level, hi // level)).fetchone()[0]


@storage_errors(source=HISTORY_SOURCE)
def has_run(db: History, run_id: str) -> bool:
    """Whether the history holds the run's run record."""
    return db.execute("SELECT 1 FROM runs WHERE run_id=?", (run_id,)).fetchone() is not None


@storage_errors(source=HISTORY_SOURCE)
def ranks(db: History, run_id: str) -> list[int]:
    """The ranks of a run, one index probe each (no scan of the steps)."""
    out: list[int] = []
    while True:
        row = db.execute("SELECT MIN(rank) FROM steps WHERE run_id=? AND rank>?",
                         (run_id, out[-1] if out else -(1 << 62))).fetchone()
        if row[0] is None:
            return out
        out.append(row[0])


@storage_errors(source=HISTORY_SOURCE)
def run_meta(db: History, run_id: str) -> dict[str, Any]:
    row = db.execute("SELECT warmup, total_steps, project FROM runs WHERE run_id=?",
                     (run_id,)).fetchone()
    names = dict(db.execute("SELECT space, names FROM names WHERE run_id=?", (run_id,)))
    return {
        "warmup": row[0] if row else 0, "total_steps": row[1] if row else None,
        "project": row[2] if row else None,
        "layers": wire.loads(names["param"]) if "param" in names else [],
        "modules": wire.loads(names["module"]) if "module" in names else [],
    }


def _bucket_sql(lo: int, hi: int, points: int) -> tuple[str, list[Any]]:
    return "CAST((step - ?) * ? / ? AS INTEGER)", [lo, points, hi - lo + 1]


@storage_errors(source=HISTORY_SOURCE)
def scalars(db: History, run_id: str, rank: int = 0, start: int | None = None,
            end: int | None = None, points: int = 1000) -> dict[str, Any]:
    """Every per-step scalar of one rank over [start, end], at most ``points`` buckets."""
    found = step_range(db, run_id, rank)
    if found is None:
        return {"steps": [], "series": {}, "bucketed": False, "nonfinite_steps": [],
                "skipped_steps": []}
    lo, hi = max(found[0], start if start is not None else found[0]), min(
        found[1], end if end is not None else found[1])
    where, args = "run_id=? AND rank=? AND step BETWEEN ? AND ?", [run_id, rank, lo, hi]
    count = _count(db, run_id, rank, lo, hi, points)
    if count <= points:
        rows = db.execute(f"SELECT step, {', '.join(SCALARS)} FROM steps WHERE {where} "
                          "ORDER BY step", args).fetchall()
        cols: list[tuple[Any, ...]] = (list(zip(*rows, strict=True)) if rows
                                       else [() for _ in range(len(SCALARS) + 1)])
        series: dict[str, dict[str, list[float | None] | None]] = {
            c: {"mean": _clean(cols[i + 1]), "min": None, "max": None}
            for i, c in enumerate(SCALARS)}
        steps = list(cols[0])
    else:
        steps, series = _bucketed(db, run_id, rank, lo, hi, points)
    series = {c: v for c, v in series.items() if any(x is not None for x in v["mean"] or ())}
    flagged = db.execute(f"SELECT step, nonfinite FROM steps INDEXED BY steps_nonfinite WHERE "
                         f"{where} AND nonfinite != 0 ORDER BY step LIMIT 1000", args).fetchall()
    bad = [step for step, flags in flagged if flags & ~GUARD_SKIPPED]
    skipped = [step for step, flags in flagged if flags & GUARD_SKIPPED]
    return {"steps": steps, "series": series, "bucketed": count > points,
            "nonfinite_steps": bad, "skipped_steps": skipped, "range": [lo, hi],
            "count": count}


@storage_errors(source=HISTORY_SOURCE)
def branches(db: History, run_id: str, rank: int, start: int | None = None,
             end: int | None = None) -> list[dict[str, Any]]:
    """The run's abandoned branches (indexer.py ``branch``) for one rank, oldest first:
    the step it was rolled back to and the abandoned steps' loss and grad norm within
    [start, end]. Each holds at most ``MAX_BRANCH_POINTS`` steps, and a run at most
    ``max_attempts_per_run`` branches."""
    out = []
    for attempt, to_step in db.execute("SELECT attempt, to_step FROM branches WHERE "
                                       "run_id = ? ORDER BY attempt", (run_id,)).fetchall():
        rows = db.execute(
            "SELECT step, loss, grad_norm FROM branch_steps WHERE run_id = ? AND attempt = ? "
            "AND rank = ? AND step BETWEEN ? AND ? ORDER BY step",
            (run_id, attempt, rank, start if start is not None else -1,
             end if end is not None else 2**62)).fetchall()
        if rows:
            steps, loss, grad = zip(*rows, strict=True)
            out.append({"attempt": attempt, "rolled_back_to": to_step, "steps": list(steps),
                        "loss": _clean(loss), "grad_norm": _clean(grad)})
    return out


@storage_errors(source=HISTORY_SOURCE)
def latest(db: History, run_id: str, rank: int) -> dict[str, Any]:
    """The last stored step's values (the page's header for a run no longer in memory)."""
    row = db.execute(f"SELECT step, {', '.join(SCALARS)} FROM steps WHERE run_id=? AND rank=? "
                     "ORDER BY step DESC LIMIT 1", (run_id, rank)).fetchone()
    if row is None:
        return {}
    return {"step": row[0], **dict(zip(SCALARS, _clean(row[1:]), strict=True))}


@storage_errors()
def recent_throughput(db: History, run_id: str, rank: int) -> float | None:
    """The median tokens/s of the last ``RECENT_STEPS`` steps that report one."""
    # Among the last 4 x RECENT_STEPS steps only: a run that never reports tokens/s must
    # not cost a scan of all its steps on every poll.
    rows = db.execute("SELECT tps FROM (SELECT tokens_per_second AS tps FROM steps WHERE "
                      "run_id=? AND rank=? ORDER BY step DESC LIMIT ?) WHERE tps IS NOT NULL "
                      "LIMIT ?", (run_id, rank, 4 * RECENT_STEPS, RECENT_STEPS)).fetchall()
    return float(np.median([r[0] for r in rows])) if rows else None


@storage_errors()
def user_names(db: History, run_id: str) -> list[str]:
    """The run's user scalar names, first logged first (history.user_scalars)."""
    row = db.execute("SELECT names FROM names WHERE run_id=? AND space='user'",
                     (run_id,)).fetchone()
    return list(wire.loads(row[0])) if row else []


@storage_errors()
def user_series(db: History, run_id: str, rank: int, lo: int, hi: int,
                points: int, names: list[str]) -> dict[str, dict[str, Any]]:
    """Each named user scalar on its own steps in [lo, hi], at most ``points`` buckets
    (min/max only where a bucket held several steps). Non-finite values are null. Long
    ranges read the pre-aggregated blocks (blocks.aggregate_user), as ``scalars`` does."""
    bucket, bargs = _bucket_sql(lo, hi, points)
    level = block_level(lo, hi, points)
    out: dict[str, dict[str, Any]] = {}
    for i, name in enumerate(names):
        if level is None:
            sql = (f"SELECT CAST(AVG(step) AS INTEGER), MIN(value), MAX(value), AVG(value), "
                   f"COUNT(*) FROM user_scalars WHERE run_id=? AND rank=? AND name=? AND step "
                   f"BETWEEN ? AND ? GROUP BY {bucket} ORDER BY 1")
            args = [run_id, rank, i, lo, hi, *bargs]
        else:
            sql = ("SELECT CAST(SUM(step_sum) / SUM(n) AS INTEGER), MIN(vmin), MAX(vmax), "
                   "SUM(vsum) / SUM(vn), SUM(n) FROM user_blocks WHERE run_id=? AND rank=? AND "
                   "name=? AND level=? AND block BETWEEN ? AND ? AND n > 0 GROUP BY "
                   "CAST((step_sum / n - ?) * ? / ? AS INTEGER) ORDER BY 1")
            args = [run_id, rank, i, level, lo // level, hi // level, lo, points, hi - lo + 1]
        rows = db.execute(sql, args).fetchall()
        if not rows:
            continue
        cols = list(zip(*rows, strict=True))
        many = max(cols[4]) > 1
        out[name] = {"steps": list(cols[0]), "mean": _clean(cols[3]),
                     "min": _clean(cols[1]) if many else None,
                     "max": _clean(cols[2]) if many else None}
    return out


def block_level(lo: int, hi: int, points: int) -> int | None:
    """The coarsest pre-aggregated level with at least 2 blocks per bucket, or None.

    A block goes to the bucket of its mean step, so a spike in a block that straddles a
    bucket edge moves by at most half a block: a quarter of a bucket, under a pixel."""
    width = (hi - lo + 1) / points
    return next((lv for lv in reversed(BLOCK_LEVELS) if lv * 2 <= width), None)


def _bucketed(db: History, run_id: str, rank: int, lo: int, hi: int,
              points: int) -> tuple[list[int], dict[str, dict[str, list[float | None] | None]]]:
    level = block_level(lo, hi, points)
    if level is None:
        bucket, bargs = _bucket_sql(lo, hi, points)
        aggs = ", ".join(f"MIN({c}), MAX({c}), AVG({c})" for c in SCALARS)
        sql = (f"SELECT CAST(AVG(step) AS INTEGER), {aggs} FROM steps WHERE run_id=? AND "
               f"rank=? AND step BETWEEN ? AND ? GROUP BY {bucket} ORDER BY 1")
        args = [run_id, rank, lo, hi, *bargs]
    else:
        bucket = "CAST((step_sum / n - ?) * ? / ? AS INTEGER)"
        aggs = ", ".join(f"MIN({c}_min), MAX({c}_max), SUM({c}_sum) / SUM({c}_n)"
                         for c in SCALARS)
        sql = (f"SELECT CAST(SUM(step_sum) / SUM(n) AS INTEGER), {aggs} FROM step_blocks "
               f"WHERE run_id=? AND rank=? AND level=? AND block BETWEEN ? AND ? "
               f"GROUP BY {bucket} ORDER BY 1")
        args = [run_id, rank, level, lo // level, hi // level, lo, points, hi - lo + 1]
    cols = list(zip(*db.execute(sql, args).fetchall(), strict=True))
    series: dict[str, dict[str, list[float | None] | None]] = {
        c: {"min": _clean(cols[1 + 3 * i]), "max": _clean(cols[2 + 3 * i]),
            "mean": _clean(cols[3 + 3 * i])} for i, c in enumerate(SCALARS)}
    return list(cols[0]), series


def update_band(steps: list[int], warmup: int, total: int | None) -> dict[str, list[float]]:
    """The update-ratio detector's healthy phase band at each step (detectors/support/phase.py)."""
    bands = [UPDATE_BANDS[phase_of(s, warmup, total)] for s in steps]
    return {"low": [b[0] for b in bands], "high": [b[1] for b in bands]}


@storage_errors(source=HISTORY_SOURCE)
def rank_step_times(db: History, run_id: str, lo: int, hi: int,
                    points: int) -> dict[str, Any]:
    """Step time per rank on shared buckets (max per bucket: a straggler is a slow step)."""
    level = block_level(lo, hi, points)
    if level is None:
        bucket, bargs = _bucket_sql(lo, hi, points)
        rows = db.execute(f"SELECT rank, {bucket} AS b, MAX(step_time) FROM steps WHERE "
                          "run_id=? AND step BETWEEN ? AND ? GROUP BY rank, b",
                          bargs + [run_id, lo, hi])
    else:
        rows = db.execute("SELECT rank, CAST((step_sum / n - ?) * ? / ? AS INTEGER) AS b, "
                          "MAX(step_time_max) FROM step_blocks WHERE run_id=? AND level=? AND "
                          "block BETWEEN ? AND ? GROUP BY rank, b",
                          (lo, points, hi - lo + 1, run_id, level, lo // level, hi // level))
    table: dict[int, dict[int, float]] = {}
    for rank, b, value in rows:
        table.setdefault(rank, {})[b] = value
    buckets = sorted({b for per in table.values() for b in per})
    width = (hi - lo + 1) / points
    return {"steps": [int(lo + (b + 0.5) * width) for b in buckets],
            "ranks": {str(r): _clean(per.get(b, math.nan) for b in buckets)
                      for r, per in sorted(table.items())}}


@storage_errors(source=HISTORY_SOURCE)
def evals(db: History, run_id: str, rank: int, lo: int | None, hi: int | None,
          points: int) -> dict[str, Any]:
    """Validation loss and per-category eval losses (evals are few: stride when not)."""
    rows = db.execute("SELECT step, val_loss, categories FROM evals WHERE run_id=? AND rank=? "
                      "AND step BETWEEN ? AND ? ORDER BY step",
                      (run_id, rank, lo if lo is not None else -1,
                       hi if hi is not None else 1 << 62)).fetchall()
    stride = max(1, math.ceil(len(rows) / points))
    rows = rows[::stride]
    cats = [wire.loads(r[2]) if r[2] else {} for r in rows]
    names = sorted({n for c in cats for n in c})
    return {"steps": [r[0] for r in rows], "val_loss": _clean(r[1] for r in rows),
            "categories": {n: _clean(c.get(n, math.nan) for c in cats) for n in names}}


MAX_MATRIX_CELLS = 1 << 19
"""Cells (names x buckets) of one matrix answer: 2 MiB of float32, about 12 MiB with the
batch being read and the answer's base64 and JSON copies, so that one chart, like a page
of records (api/streamed_page.py), holds at most 16 MiB. Still more than a heatmap draws
(500 layers x 1000 buckets); a model with more layers gets fewer buckets."""
MATRIX_BATCH_BYTES = 2 << 20
"""Stored rows are read and folded into the buckets this many bytes at a time, so a long
range costs its answer, not its rows (300k stored steps of 6000 layers are 7 GB)."""


@storage_errors(source=HISTORY_SOURCE)
def matrix(db: History, run_id: str, stat: str, rank: int = 0,
           start: int | None = None, end: int | None = None, points: int = 500,
           layer: str | None = None) -> dict[str, Any]:
    """A per-layer statistic as a (names x buckets) matrix, row-major, in model order.

    For ``grad_quantiles`` ``layer`` picks one parameter and the answer is its 8 quantile
    bands over the buckets instead (min of the low tails, max of the high ones). At most
    ``MAX_MATRIX_CELLS`` cells: ``points`` is lowered to fit.
    """
    space = MATRICES[stat]
    meta = run_meta(db, run_id)
    names = meta["layers"] if space == "param" else meta["modules"]
    out: dict[str, Any] = {"stat": stat, "names": names, "steps": [], "values_f32": ""}
    if not names:
        return out
    quantiles = stat == "grad_quantiles"
    stored_width = len(names) * (QUANTILE_WIDTH if quantiles else 1)
    pick = (names.index(layer) if layer in names else 0) if quantiles else 0
    cols = slice(pick * QUANTILE_WIDTH, (pick + 1) * QUANTILE_WIDTH) if quantiles else slice(
        0, stored_width)
    width = cols.stop - cols.start
    points = max(2, min(points, MAX_MATRIX_CELLS // width))
    sql, params = _matrix_rows(db, run_id, rank, stat, start, end, points)
    lo, hi, count = db.execute(f"SELECT MIN(step), MAX(step), COUNT(*) FROM ({sql})",
                               (1, 4, *params)).fetchone()
    if not count:
        return out
    if quantiles:
        out["layer"] = names[pick]
    buckets = min(count, points)
    low = np.full((buckets, width), np.nan, dtype=np.float32)
    high = np.full((buckets, width), np.nan, dtype=np.float32)
    total = np.zeros((buckets, width), dtype=np.float32) if quantiles else None
    rows_in = np.zeros(buckets, dtype=np.int64)
    first = np.full(buckets, -1, dtype=np.int64)
    last = np.zeros(buckets, dtype=np.int64)
    # Only the columns answered are read out of each stored vector (vectors.SLICE_SQL).
    cursor = db.execute(sql, (1 + 4 * cols.start, 4 * width, *params))
    batch = max(1, MATRIX_BATCH_BYTES // (4 * stored_width))
    seen = 0
    while chunk := cursor.fetchmany(batch):
        steps = np.fromiter((r[0] for r in chunk), dtype=np.int64, count=len(chunk))
        values = vectors.decode_rows([r[1] for r in chunk], cols.start, cols.stop)
        if count <= points:  # as stored: a bucket per row
            ids = np.arange(seen, seen + len(chunk))
        else:
            ids = ((steps - lo) * points) // (hi - lo + 1)
        seen += len(chunk)
        starts = np.flatnonzero(np.diff(ids, prepend=-1))  # ids ascend: runs of a bucket
        at = ids[starts]
        with np.errstate(all="ignore"):  # an all-NaN bucket is a gap, not an error
            high[at] = np.fmax(high[at], np.fmax.reduceat(values, starts, axis=0))
            if quantiles and total is not None:
                low[at] = np.fmin(low[at], np.fmin.reduceat(values, starts, axis=0))
                total[at] += np.add.reduceat(np.nan_to_num(values), starts, axis=0)
        rows_in[at] += np.diff(np.append(starts, len(ids)))
        first[at] = np.where(first[at] < 0, steps[starts], first[at])
        last[at] = steps[np.append(starts[1:], len(ids)) - 1]
    used = np.flatnonzero(rows_in)
    if quantiles and total is not None:
        mid = total[used] / rows_in[used][:, None]
        agg = np.concatenate([low[used][:, :3], mid[:, 3:5], high[used][:, 5:]], axis=1)
    else:
        agg = high[used]
    xs = first[used] if count <= points else (first[used] + last[used]) // 2
    out["steps"] = xs.tolist()
    # names x buckets (quantiles: 8 x buckets), float32 little-endian: 150 layers x 1000
    # buckets is 600 kB this way, several MB as JSON numbers, and no per-value Python work.
    out["values_f32"] = base64.b64encode(
        np.ascontiguousarray(agg.T, dtype="<f4").tobytes()).decode()
    return out


def _matrix_rows(db: History, run_id: str, rank: int, stat: str,
                 start: int | None, end: int | None, points: int) -> tuple[str, tuple]:
    """The query of the range's (step, vector) rows, in step order: the stored ones, or
    per-layer maxima of blocks (placed at their middle step) when the range spans at
    least 2 blocks per bucket."""
    found = step_range(db, run_id, rank)
    lo = start if start is not None else (found[0] if found else -1)
    hi = end if end is not None else (found[1] if found else 1 << 62)
    level = block_level(lo, hi, points) if stat in BLOCKED_MATRICES and found else None
    # Its first two parameters are vectors.SLICE_SQL's, the caller's.
    if level is None:
        return (f"SELECT step, {vectors.SLICE_SQL} FROM matrices WHERE run_id=? AND rank=? "
                "AND stat=? AND step BETWEEN ? AND ? ORDER BY step",
                (run_id, rank, stat, lo, hi))
    return (f"SELECT block * {level} + {level // 2} AS step, {vectors.SLICE_SQL} FROM "
            "matrix_blocks WHERE run_id=? AND rank=? AND stat=? AND level=? AND block "
            "BETWEEN ? AND ? ORDER BY block",
            (run_id, rank, stat, level, lo // level, hi // level))
