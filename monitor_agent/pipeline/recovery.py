"""Snapshot and restore of a run, so a sidecar restart is invisible to detection.

A snapshot holds the detector suite's state and the run's counters, tagged with the id of
the last record it covers. Restoring loads it; the engine then replays every record stored
after that id (``stored_tail``) through its own pipeline, the very path live records take.
This module reads the store and fills a run; it never drives the engine.

A run is snapshotted after its second step (``RunRegistry.snapshot`` calls ``snapshot_run``;
the engine's tick does so on a timer) and a third step is stored. After a restart,
``restore_run`` fills a fresh run and suite from the snapshot (it returns None for a run
never stored), and ``stored_tail`` is what the engine then replays::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.detectors import DetectorSuite
    >>> from monitor_agent.metrics.sidecar import SelfMetrics
    >>> from monitor_agent.pipeline.engine import Engine, Incoming
    >>> from monitor_agent.settings import Settings
    >>> engine = Engine(Settings(), Store(":memory:"), SelfMetrics(CollectorRegistry()))
    >>> for n in (1, 2, 3):
    ...     step = {"kind": "step", "run_id": "r1", "step": n, "time": float(n)}
    ...     _ = engine.ingest([Incoming(0, *schemas.parse_for_store(step))], now=float(n))
    ...     if n == 2:
    ...         engine.registry.snapshot(engine.registry.get("r1"))
    >>> run, suite = RunState.new("r1", now=4.0), DetectorSuite()
    >>> after = restore_run(engine.store, run, suite, now=4.0)
    >>> after, run.ranks[0].steps_total   # the snapshot covers rows 1 and 2
    (2, 2)
    >>> [(row.row_id, row.attempt, row.record.step, row.origin)
    ...  for row in stored_tail(engine.store, "r1", after)]
    [(3, 1, 3, None)]
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, NamedTuple

from monitor_agent.records import schemas, wire
from monitor_agent.records.types import EvalRecord, Record, RunRecord, StepRecord
from monitor_agent.runs.checkpoint_ledger import CheckpointLedger, LedgerEntry
from monitor_agent.runs.run_state import RankState, RunState
from monitor_agent.storage.store import Store

if TYPE_CHECKING:
    from monitor_agent.detectors import DetectorSuite

log = logging.getLogger(__name__)

_RANK_FIELDS = (
    "last_step", "last_eval_step", "steps_total", "tokens_total", "samples_total",
    "skipped_total", "step_time_counts", "step_time_sum",
)
# Absent from snapshots older than data positions (issue 31): restored when present.
_DATA_FIELDS = ("data_position", "data_step", "data_deltas")


def snapshot_run(run: RunState, suite: DetectorSuite) -> dict[str, Any]:
    """The run's state to keep, its non-finite floats as strings (the suite's snapshot
    writes its own so): ``wire.dumps_prepared`` serialises it."""
    return {"suite": suite.snapshot(), **wire.encode_nonfinite({
        "status": run.status,
        "findings": [[t, s, c] for (t, s), c in run.findings.items()],
        "verdict": asdict(run.verdict),
        "nodes": run.nodes.to_dict(),
        "ranks": {
            str(rank): {**{f: getattr(state, f) for f in _RANK_FIELDS + _DATA_FIELDS},
                        "skipped_by_reason": dict(state.skipped_by_reason),
                        "remote": state.remote, "via": state.via}
            for rank, state in run.ranks.items()
        },
    })}


def restore_run(store: Store, run: RunState, suite: DetectorSuite, now: float,
                snapshot: bool = True) -> int | None:
    """Fill a fresh run and suite from the store's row and snapshot (``snapshot`` False:
    ignore it); return the id of the last record the snapshot covers (0: none), or None
    when the run was never stored."""
    row = store.run_row(run.run_id)
    if row is None:
        return None
    run.first_seen = row.first_seen
    run.last_arrival = min(row.last_seen, now)
    run.status = row.status
    run.stored_verdict = row.verdict
    if row.run_record:
        record = _stored(row.run_record, run.run_id)
        run.run = record if isinstance(record, RunRecord) else None
    saved = store.detector_state(run.run_id) if snapshot else None
    after = 0
    if saved is not None:
        after, blob = saved
        _restore_state(run, suite, wire.loads(blob))
        run.status = row.status  # the store's: a new attempt may have made it running again
        _reload_latest(store, run)
    run.snapshot_record_id = run.last_record_id = after
    return after


class StoredRecord(NamedTuple):
    """A stored record as recovery feeds it again: its row, attempt, the record, its
    stored JSON and, for a run leader's digest, the node it came from (cluster/)."""

    row_id: int
    attempt: int
    record: Record
    body: bytes
    origin: int | None


def stored_tail(store: Store, run_id: str, after: int,
                replaced: bool = False) -> Iterator[StoredRecord]:
    """The run's current history (pipeline/attempts.py) stored after row ``after``, in
    arrival order (``replaced``: with the records later attempts replaced); rows that no
    longer validate are skipped (``_stored``)."""
    for row_id, attempt, body, origin in store.records_after(run_id, after, replaced):
        record = _stored(body, run_id)
        if record is not None:
            yield StoredRecord(row_id, attempt, record, body, origin)


def _restore_state(run: RunState, suite: DetectorSuite, state: dict[str, Any]) -> None:
    suite.restore(state["suite"])
    run.status = state.get("status", run.status)
    run.findings = {(t, s): int(c) for t, s, c in state.get("findings", [])}
    run.verdict.restore(state.get("verdict") or {})
    run.nodes.restore(state.get("nodes") or {})
    run.refresh_nodes()
    run.verdict_label = run.verdict.verdict(run.status).label
    for rank, fields in state.get("ranks", {}).items():
        rs = run.ranks[int(rank)] = RankState()
        for name in _RANK_FIELDS:
            setattr(rs, name, wire.nonfinite_to_float(fields[name]))
        rs.skipped_by_reason = {str(k): int(v)  # absent from snapshots older than the guard
                                for k, v in (fields.get("skipped_by_reason") or {}).items()}
        for name in _DATA_FIELDS:
            if name in fields:
                setattr(rs, name, fields[name])
        rs.loss_ema = suite.ema_loss(int(rank))
        via = fields.get("via")
        rs.via = via if isinstance(via, str) else None
        rs.remote = bool(fields.get("remote"))  # absent from snapshots before the leader


def stored_ledger(store: Store, run_id: str) -> CheckpointLedger:
    """The checkpoint ledger of a run's current history, from the rows the store keeps:
    its paged findings and its checkpoints (runs/ reads no storage: it is handed them)."""
    findings = [wire.loads(body) for body in store.page_findings(run_id)]
    entries = [LedgerEntry(c.step, c.path, c.rank, c.time, c.attempt, c.bytes, c.tag,
                           c.token, c.position) for c in store.checkpoints(run_id)]
    return CheckpointLedger.of(findings, entries)


def _reload_latest(store: Store, run: RunState) -> None:
    """The latest step and eval of each rank, so gauges show values at once."""
    for rank, state in run.ranks.items():
        body = store.last_record(run.run_id, rank, "step")
        last = _stored(body, run.run_id) if body is not None else None
        if isinstance(last, StepRecord):
            state.last = last
            state.last_layers = state.last.layers
            state.last_layers_clip = state.last.clip_coef
            state.last_effective_lr = state.last.effective_lr
            state.last_activations = state.last.activations
            # Only when the latest step was a hist step; otherwise from the next one on.
            state.last_grad_quantiles = state.last.grad_quantiles
            state.last_param_quantiles = state.last.param_quantiles
        body = store.last_record(run.run_id, rank, "eval")
        if body is not None:
            record = _stored(body, run.run_id)
            state.last_eval = record if isinstance(record, EvalRecord) else None
    run.changed()


def _stored(body: bytes, run_id: str) -> Record | None:
    """A stored record, or None when today's rules reject it (stored by an older version,
    e.g. a config with a lone surrogate): one bad row must not keep a run from loading."""
    try:
        return schemas.parse_record(wire.loads(body))
    except (schemas.RecordError, ValueError) as exc:
        log.warning("run %s: skipping a stored record that no longer validates: %s",
                    run_id, exc)
        return None

