"""``HistoryBuilder``: folds records into the chart history, a compact, column-wise copy
of the records built for fast reads.

Stored records are JSON lines (a GPT step with layer stats and histograms is tens of kB);
parsing 200,000 of them per page view would take minutes. ``HistoryBuilder`` folds each
record once into narrow SQLite rows: one row of scalars per step, one float32 vector per
step for each per-layer statistic (layers in model order), so a chart reads only the
columns it draws. ``indexer.HistoryIndexer`` keeps that copy in step with the database
from a thread of its own, through a read-only connection (engine state is never touched).
A SQLite failure of ``add`` or ``commit`` leaves as ``StorageError`` (source
``HISTORY_SOURCE``, ``schema.py``).

The indexer folds the stored lines, the report (tools/report.py) a trace's; three steps of a
run with two layers, then what a chart reads::

    >>> from monitor_agent.history.schema import open_history
    >>> db = open_history(":memory:")
    >>> builder = HistoryBuilder(db, ema_alpha=0.99)
    >>> for step in (1, 2, 3):
    ...     builder.add({"kind": "step", "run_id": "gpt-7", "step": step, "time": 1.0,
    ...                  "loss": 3.0 - step / 2,
    ...                  "layers": {"wte": {"grad_norm": 0.5}, "h.0": {"grad_norm": step}}})
    >>> builder.commit(last_id=3)   # the id of the record folded last: the indexer's cursor
    >>> db.execute("SELECT step, loss FROM steps ORDER BY step").fetchall()
    [(1, 2.5), (2, 2.0), (3, 1.5)]
    >>> row = db.execute("SELECT data FROM matrices WHERE stat = 'grad_norm' AND step = 3")
    >>> np.frombuffer(row.fetchone()[0], np.float32).tolist()   # layers in model order
    [0.5, 3.0]
    >>> db.close()
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from monitor_agent.detectors.category_divergence import category_losses
from monitor_agent.detectors.support.stats import Ema
from monitor_agent.history import blocks, vectors
from monitor_agent.history.blocks import BLOCK_LEVELS, BLOCKED_MATRICES, SCALARS
from monitor_agent.history.schema import HISTORY_SOURCE, RUN_TABLES, History
from monitor_agent.records import wire
from monitor_agent.records.types import GUARD_SKIP_REASONS
from monitor_agent.storage.database import storage_errors

MATRICES: dict[str, str] = {
    "grad_norm": "param", "update_ratio": "param",
    "act_max_abs": "module", "act_zero_frac": "module", "grad_quantiles": "param",
}
"""Per-step vectors and the name space (parameters or modules) their entries follow."""

QUANTILE_WIDTH = 8  # min, p1, p25, p50, p75, p95, p99, max (types.QUANTILE_LEVELS)

MAX_USER_SCALARS = 256
"""Distinct user scalar names kept per run (``user_scalars``); later names are dropped: a
script logging a fresh name every step must not grow the history without bound."""
# The steps table's ``nonfinite`` flags: 1 the loss, 2 the grad norm is NaN/Inf; and this
# bit, a step the client's step guard skipped (drawn as a mark, like a NaN step): one
# flag column and one partial index serve every "mark this step" the charts draw.
GUARD_SKIPPED = 4

MAX_NAMES = 2000
"""Columns a run's chart history keeps per name space (the app passes its
``max_layers_exposed``, the per-layer series a run shows on /metrics too). A step's vector
has a slot for every name known when it was folded (``vectors`` stores it sparse when most
are empty); past this many names, new ones are not charted (they are stored, and the
detectors track up to ``max_layer_names_per_run``), which bounds a vector at
``MAX_NAMES`` slots and a heatmap at ``MAX_NAMES`` rows."""

def _num(value: Any) -> float | None:
    """A stored float: non-finite values become NULL (SQLite cannot hold NaN)."""
    value = wire.nonfinite_to_float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _nan(value: Any) -> float:
    """A vector entry: missing is NaN (float32 vectors keep non-finite values as they are)."""
    value = wire.nonfinite_to_float(value)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    return float(value)


def _is_number(value: Any) -> bool:
    """A measured value: a number or a spelled non-finite one (not a bool, not text)."""
    value = wire.nonfinite_to_float(value)
    return not isinstance(value, bool) and isinstance(value, int | float)


def user_scalars(step: dict[str, Any]) -> dict[str, Any]:
    """The script's own numbers on a step record: its ``metrics`` (docs/format.md), as
    ``log_step(..., metrics={"accuracy": 0.91})`` sends them.

        >>> user_scalars({"kind": "step", "run_id": "r", "step": 3, "time": 1.0, "loss": 2.0,
        ...               "metrics": {"accuracy": 0.91, "ppl": "NaN", "ok": True}})
        {'accuracy': 0.91, 'ppl': 'NaN'}
    """
    metrics = step.get("metrics")
    if not isinstance(metrics, dict):
        return {}
    return {k: v for k, v in metrics.items() if _is_number(v)}


def _nonfinite(value: Any) -> bool:
    value = wire.nonfinite_to_float(value)
    return isinstance(value, float) and not math.isfinite(value)


def _column(values: Any) -> np.ndarray:
    """Stored numbers as float32; missing or not a number is NaN, the spelled non-finite
    strings are what they say. Floats, the common case, take no Python call. A float beyond
    float32's range is drawn as the infinity it becomes there, without a warning."""
    with np.errstate(over="ignore"):
        return np.array([v if v.__class__ is float else _nan(v) for v in values],
                        dtype=np.float32)


def _scatter(pos: tuple[np.ndarray, int] | None, values: np.ndarray) -> np.ndarray:
    """``values`` placed in the run's column order (NaN where a column got no value; a
    value whose name has no column, past ``MAX_NAMES``, is left out)."""
    if pos is None:
        return values
    where, size = pos
    out = np.full((size, *values.shape[1:]), np.nan, dtype=np.float32)
    kept = where >= 0
    out[where[kept]] = values[kept]
    return out


class HistoryBuilder:
    """Folds record dicts into the history tables; ``commit`` writes what was added.

    It reads the stored JSON as dicts (``wire.loads``), not as the ``records.types``
    dataclasses that ``records.schemas.parse_record`` makes: the records passed that
    validation once already (at ingest, or in the report's replay), and validating each
    again costs three to four times the whole fold (bench/ui.py's records: 20,000 steps
    parse in ~1.5 s and fold in ~0.4 s), while the fold takes a few scalars and whole
    per-layer columns from the dicts as they are. Non-finite values arrive spelled as
    strings here (``_num`` and ``_nan`` read them).
    """

    def __init__(self, db: History, ema_alpha: float = 0.99,
                 default_warmup: int = 0, max_names: int = MAX_NAMES) -> None:
        self.db = db
        self.max_names = max_names
        self.alpha = ema_alpha
        self.default_warmup = default_warmup
        self._names: dict[tuple[str, str], list[str]] = {}
        self._index: dict[tuple[str, str], dict[str, int]] = {}
        self._ema: dict[tuple[str, int], Ema] = {}  # the detectors' loss EMA, per rank
        self._dirty_names: set[tuple[str, str]] = set()
        self._steps: list[tuple[Any, ...]] = []
        self._evals: list[tuple[Any, ...]] = []
        self._matrices: list[tuple[Any, ...]] = []
        self._user: list[tuple[Any, ...]] = []

    # -- folding --------------------------------------------------------------------------

    @storage_errors(source=HISTORY_SOURCE)
    def add(self, obj: dict[str, Any]) -> None:
        kind = obj.get("kind")
        if kind == "step":
            self._add_step(obj)
        elif kind == "eval":
            self._add_eval(obj)
        elif kind == "run":
            self._add_run(obj)

    def _add_run(self, obj: dict[str, Any]) -> None:
        run_id, config = obj["run_id"], obj.get("config") or {}
        labels = obj.get("labels") or {}
        warmup = config.get("warmup_steps")
        self.db.execute(
            "INSERT OR REPLACE INTO runs VALUES (?,?,?,?)",
            (run_id, warmup if isinstance(warmup, int) else self.default_warmup,
             config.get("total_steps") if isinstance(config.get("total_steps"), int) else None,
             labels.get("project") or obj.get("project")),
        )
        order = (obj.get("model") or {}).get("layer_order")
        if isinstance(order, list):
            self._place(run_id, "param", [str(n) for n in order])

    def _add_step(self, obj: dict[str, Any]) -> None:
        run_id, rank, step = obj["run_id"], int(obj.get("rank", 0)), int(obj["step"])
        memory = obj.get("memory") or {}
        # A step the guard skipped never reached the weights: its loss (a bad batch's, often
        # huge) stays out of the line, the axis and the EMA; the chart marks the step.
        guarded = bool(obj.get("skipped")) and obj.get("skip_reason") in GUARD_SKIP_REASONS
        loss = None if guarded else _num(obj.get("loss"))
        ema = self._ema_state(run_id, rank)
        if loss is not None:
            ema.add(loss)
        param, update = _num(obj.get("param_norm")), _num(obj.get("update_norm"))
        row = {
            "loss": loss, "lr": _num(obj.get("lr")), "grad_norm": _num(obj.get("grad_norm")),
            "loss_ema": ema.value,
            "clip_threshold": _num(obj.get("clip_threshold")),
            "update_ratio": update / param if update is not None and param else None,
            "tokens_per_second": _num(obj.get("tokens_per_second")), "mfu": _num(obj.get("mfu")),
            "mem_allocated": _num(memory.get("allocated_bytes")),
            "mem_reserved": _num(memory.get("reserved_bytes")),
            "mem_peak": _num(memory.get("peak_allocated_bytes")),
            "step_time": _num(obj.get("step_time")), "data_time": _num(obj.get("data_time")),
            "loss_scale": _num(obj.get("loss_scale")),
        }
        # A guard-skipped step is its own mark: its NaN (the reason it was skipped) is not
        # a NaN of the run's, which the red NaN marks stand for.
        bad = GUARD_SKIPPED if guarded else (
            int(_nonfinite(obj.get("loss"))) | 2 * int(_nonfinite(obj.get("grad_norm"))))  # a mark on the chart, found through the same partial index
        self._steps.append((run_id, rank, step, bad, *(row[c] for c in SCALARS)))
        self._add_vectors(run_id, rank, step, obj)
        if "metrics" in obj:
            self._add_user(run_id, rank, step, user_scalars(obj))

    def _add_user(self, run_id: str, rank: int, step: int, found: dict[str, Any]) -> None:
        if not found:
            return
        index = self._place(run_id, "user", [])
        fresh = [n for n in found if n not in index][:max(0, MAX_USER_SCALARS - len(index))]
        if fresh:
            self._place(run_id, "user", fresh)
        self._user.extend((run_id, rank, index[n], step, _num(v)) for n, v in found.items()
                          if n in index)

    def _add_vectors(self, run_id: str, rank: int, step: int, obj: dict[str, Any]) -> None:
        # Whole columns at once: a GPT-sized record has ~150 layers x several stats, and a
        # Python call per value made this fold cost more than the ingest it follows.
        layers = obj.get("layers")
        if isinstance(layers, dict) and layers:
            pos = self._positions(run_id, "param", list(layers))
            stats = [s if isinstance(s, dict) else {} for s in layers.values()]
            grad = _column(s.get("grad_norm") for s in stats)
            grad[[bool(s.get("grad_none")) for s in stats]] = 0.0
            param, update = (_column(s.get(k) for s in stats) for k in ("param_norm", "update_norm"))
            param[~np.isfinite(param) | (param == 0)] = np.nan
            update[~np.isfinite(update)] = np.nan
            self._vector(run_id, rank, "grad_norm", step, _scatter(pos, grad))
            self._vector(run_id, rank, "update_ratio", step, _scatter(pos, update / param))
        acts = obj.get("activations")
        if isinstance(acts, dict) and acts:
            pos = self._positions(run_id, "module", list(acts))
            stats = [s if isinstance(s, dict) else {} for s in acts.values()]
            for stat, key in (("act_max_abs", "max_abs"), ("act_zero_frac", "zero_frac")):
                self._vector(run_id, rank, stat, step,
                             _scatter(pos, _column(s.get(key) for s in stats)))
        hists = obj.get("grad_hist")
        if isinstance(hists, dict):
            rows = {n: h["quantiles"] for n, h in hists.items()
                    if isinstance(h, dict) and len(h.get("quantiles") or ()) == QUANTILE_WIDTH}
            if rows:
                pos = self._positions(run_id, "param", list(rows))
                values = _column(v for q in rows.values() for v in q).reshape(-1, QUANTILE_WIDTH)
                self._vector(run_id, rank, "grad_quantiles", step, _scatter(pos, values).ravel())

    def _positions(self, run_id: str, space: str,
                   names: list[str]) -> tuple[np.ndarray, int] | None:
        """Where ``names`` go in the run's column order, and its width; None when they are
        that order (the common case: the client sends layers in model order every time)."""
        index = self._place(run_id, space, names)
        known = self._names[(run_id, space)]
        if names == known:
            return None
        where = np.fromiter((index.get(n, -1) for n in names), dtype=np.intp, count=len(names))
        return where, len(known)

    def _vector(self, run_id: str, rank: int, stat: str, step: int, vec: np.ndarray) -> None:
        self._matrices.append((run_id, rank, stat, step, vectors.encode(vec)))

    def _add_eval(self, obj: dict[str, Any]) -> None:
        found = obj.get("metrics")
        metrics: dict[str, Any] = found if isinstance(found, dict) else {}
        cats = category_losses({k: _num(v) for k, v in metrics.items()})
        self._add_user(obj["run_id"], int(obj.get("rank", 0)), int(obj["step"]),
                       {f"eval/{k}": v for k, v in metrics.items()
                        if not k.startswith("loss/") and _is_number(v)})
        self._evals.append((obj["run_id"], int(obj.get("rank", 0)), int(obj["step"]),
                            _num(obj.get("val_loss")), wire.dumps(cats).decode() if cats else None))

    # -- per-run state, loaded from the tables on first use -------------------------------

    def _place(self, run_id: str, space: str, names: list[str]) -> dict[str, int]:
        """Indices of ``names`` in the run's column order, appending names never seen
        while the run has fewer than ``max_names``."""
        key = (run_id, space)
        if key not in self._names:
            row = self.db.execute("SELECT names FROM names WHERE run_id=? AND space=?",
                                  key).fetchone()
            self._names[key] = wire.loads(row[0]) if row else []
            self._index[key] = {n: i for i, n in enumerate(self._names[key])}
        known, index = self._names[key], self._index[key]
        for name in names:
            if name not in index and len(known) < self.max_names:
                index[name] = len(known)
                known.append(name)
                self._dirty_names.add(key)
        return index

    def _ema_state(self, run_id: str, rank: int) -> Ema:
        key = (run_id, rank)
        if key not in self._ema:
            row = self.db.execute("SELECT raw, n FROM ema WHERE run_id=? AND rank=?",
                                  key).fetchone()
            self._ema[key] = Ema(self.alpha, row[0], row[1]) if row else Ema(self.alpha)
        return self._ema[key]

    @storage_errors()
    def forget(self, run_id: str) -> None:
        """Drop a run's whole history (and what is cached of it), committed at once: a new
        attempt replaced part of it (pipeline/attempts.py) and it is folded again from
        the run's current history. Call after ``commit``: nothing of the run may wait."""
        with self.db.tx() as db:
            for table in RUN_TABLES:
                db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))
        self._names = {k: v for k, v in self._names.items() if k[0] != run_id}
        self._index = {k: v for k, v in self._index.items() if k[0] != run_id}
        self._ema = {k: v for k, v in self._ema.items() if k[0] != run_id}
        self._dirty_names = {k for k in self._dirty_names if k[0] != run_id}

    # -- writing --------------------------------------------------------------------------

    def commit(self, last_id: int | None = None) -> None:
        """Write everything folded since the last commit in one transaction."""
        with self.db.tx() as db:
            cols = ", ".join(SCALARS)
            marks = ",".join("?" * (4 + len(SCALARS)))
            db.executemany(f"INSERT OR REPLACE INTO steps (run_id, rank, step, nonfinite, "
                           f"{cols}) VALUES ({marks})", self._steps)
            blocks.aggregate_steps(db, {(r[0], r[1], r[2] // BLOCK_LEVELS[0])
                                        for r in self._steps})
            db.executemany("INSERT OR REPLACE INTO evals VALUES (?,?,?,?,?)", self._evals)
            db.executemany("INSERT OR REPLACE INTO matrices VALUES (?,?,?,?,?)", self._matrices)
            db.executemany("INSERT OR REPLACE INTO user_scalars VALUES (?,?,?,?,?)", self._user)
            blocks.aggregate_user(db, {(r[0], r[1], r[2], r[3] // BLOCK_LEVELS[0])
                                       for r in self._user})
            blocks.aggregate_matrices(db, {(r[0], r[1], r[2], r[3] // BLOCK_LEVELS[0])
                                           for r in self._matrices if r[2] in BLOCKED_MATRICES})
            db.executemany("INSERT OR REPLACE INTO names VALUES (?,?,?)",
                           [(*k, wire.dumps(self._names[k]).decode()) for k in self._dirty_names])
            db.executemany("INSERT OR REPLACE INTO ema VALUES (?,?,?,?)",
                           [(*k, v.raw, v.n) for k, v in self._ema.items()])
            if last_id is not None:
                db.execute("INSERT OR REPLACE INTO cursor VALUES (0, ?)", (last_id,))
        self._steps, self._evals, self._matrices, self._user = [], [], [], []
        self._dirty_names.clear()
