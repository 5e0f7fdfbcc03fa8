"""record -> store -> detectors -> alerting -> run state: the one pipeline, live and replay.

The engine is synchronous and single-threaded by contract: the app calls it from one worker
thread, replay calls it inline with a virtual clock. Nothing about detection exists only in
the live path.

The engine sees no wire models: the edge (the API, replay) validates with ``schemas`` and
hands it ``Incoming`` records, the ``types`` dataclass plus the JSON to store.

Example::

    engine = Engine(settings, Store(":memory:"), SelfMetrics(CollectorRegistry()))
    items = [Incoming(i, *schemas.parse_for_store(obj)) for i, obj in enumerate(objs)]
    result = engine.ingest(items, now=time.time())
    engine.tick(now=time.time())
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from monitor_agent.alerting.model import RunContext
from monitor_agent.alerting.sink import AlertSink, NullSink
from monitor_agent.detectors import DetectorSuite
from monitor_agent.metrics import names as metric_names
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import recovery
from monitor_agent.pipeline import views as run_views
from monitor_agent.pipeline.layer_cap import cap_layers
from monitor_agent.pipeline.plausible import implausible_step
from monitor_agent.pipeline.retention import Retention
from monitor_agent.pipeline.run_state import RunState
from monitor_agent.records import wire
from monitor_agent.records.types import (
    EndRecord,
    EvalRecord,
    Finding,
    Record,
    RunRecord,
    StepRecord,
)
from monitor_agent.settings import Settings
from monitor_agent.storage.store import RecordRow, StorageError, Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated record, its index in the request, and the JSON the store keeps for it
    (the client's own line, or ``schemas.stored_json``)."""

    index: int
    record: Record
    body: bytes


@dataclass(slots=True)
class IngestResult:
    """What happened to each record of a batch, as the API reports it."""

    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)


class Engine:
    """Holds every active run and drives records through the pipeline; findings go to
    ``alerts`` (``NullSink``, the default, pages nobody)."""

    def __init__(
        self, settings: Settings, store: Store, metrics: SelfMetrics,
        alerts: AlertSink | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.alerts: AlertSink = alerts if alerts is not None else NullSink()
        self.runs: dict[str, RunState] = {}
        self.suites: dict[str, DetectorSuite] = {}
        self._last_snapshot = 0.0
        self.retention = Retention(store, settings.retention_steps)
        # Runs whose last records were stored but not all of their effects: analysed again.
        self._reanalyse: set[str] = set()

    # -- ingest ---------------------------------------------------------------------------

    def ingest(self, items: Sequence[Incoming], now: float) -> IngestResult:
        """Store a validated batch in one transaction, then run it through detection.

        Raises StorageError (-> 503) when the records, or anything they cause (findings,
        alert state), could not be made durable. In the latter case the records are stored
        but their runs leave memory: reloading replays them from the store (on the client's
        retry, the next tick or a restart), so a page is never lost to a failed commit.
        """
        result = IngestResult()
        admitted = self._admit(items, result, now)
        rows = [_row(item) for item in admitted]
        t0 = time.perf_counter()
        ids = self.store.insert_records(rows)
        self.metrics.store_duration.observe(time.perf_counter() - t0)
        try:
            for item, row_id in zip(admitted, ids, strict=True):
                if row_id is None:
                    result.duplicates += 1
                    continue
                result.accepted += 1
                self._process(item.record, row_id, now, result)
            self._finish(result)
        except (sqlite3.Error, StorageError) as exc:
            for run_id in {item.record.run_id for item in admitted}:
                self._evict(run_id)
            raise StorageError(f"records stored, their alerts not: {exc}") from exc
        return result

    def preview(self, items: Sequence[Incoming], now: float) -> int:
        """Page now about NaN/Inf steps sent ahead of their backlog (``POST
        /v1/records/preview``); return how many alerts that began.

        Nothing is stored and no detector state changes: the step's in-order copy, when the
        backlog reaches it, is stored and judged like any other and its finding folds into
        the alert begun here (``Alerting.preview``). A run not in memory is paged about with
        what the record carries (its id, rank and step) and is not loaded for it.
        """
        begun = 0
        for item in items:
            record = item.record
            if not isinstance(record, StepRecord):
                continue
            run = self.runs.get(record.run_id)
            if run is not None and run.is_late(record):
                continue  # its in-order copy was judged already
            suite = self.suites.get(record.run_id) or DetectorSuite(self.settings.detectors)
            findings = suite.preview(record)
            if findings:
                context = self._context(run) if run is not None else _bare_context(record)
                begun += self.alerts.preview(context, findings, now)
        return begun

    def _evict(self, run_id: str) -> None:
        """Forget a run's in-memory state (no snapshot): the store's tail is replayed."""
        self.runs.pop(run_id, None)
        self.suites.pop(run_id, None)
        self._reanalyse.add(run_id)

    def _admit(
        self, items: Sequence[Incoming], result: IngestResult, now: float
    ) -> list[Incoming]:
        admitted: list[Incoming] = []
        seen: dict[tuple[str, int], int] = {}  # the batch's own steps count as history
        for item in items:
            run = self._run(item.record.run_id, now)
            reason: str | None
            if run is None:
                reason = (f"too many active runs (max_active_runs="
                          f"{self.settings.max_active_runs}); end or expire runs first")
                label = "too_many_runs"
            else:
                reason = implausible_step(run, item.record, seen,
                                          self.settings.max_step_jump, now)
                label = "implausible_step"
            if reason is not None:
                result.rejected.append({"index": item.index, "reason": reason})
                self.metrics.rejections.labels(reason=label).inc()
                continue
            admitted.append(item)
        return admitted

    def _process(
        self,
        record: Record,
        row_id: int,
        now: float,
        result: IngestResult,
        arrival: float | None = None,
    ) -> None:
        """``arrival`` is when the record reached us (``now`` unless replaying the store)."""
        run = self.runs[record.run_id]
        run.last_record_id = max(run.last_record_id, row_id)
        if isinstance(record, StepRecord | EvalRecord) and run.is_late(record):
            # Out-of-order or re-sent history: stored, but detectors only see time forward.
            result.late += 1
            return
        if isinstance(record, StepRecord):
            record = self._cap_layers(run, record)
        self._apply(run, record, now if arrival is None else arrival)
        findings = self._detect(run, record)
        if findings:
            self._handle_findings(run, findings, now, result)

    def _apply(self, run: RunState, record: Record, arrival: float) -> None:
        if isinstance(record, StepRecord):
            run.apply_step(record, arrival, metric_names.STEP_DURATION_BUCKETS)
        elif isinstance(record, EvalRecord):
            run.apply_eval(record, arrival)
        elif isinstance(record, RunRecord):
            run.apply_run(record)
        elif isinstance(record, EndRecord):
            run.apply_end(record.status, arrival)
            self.store.set_status(run.run_id, record.status, record.time)
            self.alerts.run_ended(run.run_id, record.status, arrival, record.step)

    def _cap_layers(self, run: RunState, record: StepRecord) -> StepRecord:
        record, dropped = cap_layers(record, run.layer_names,
                                     self.settings.max_layer_names_per_run)
        if dropped:
            self.metrics.dropped_series.labels(reason="max_layer_names").inc(dropped)
        return record

    def _detect(self, run: RunState, record: Record) -> list[Finding]:
        suite = self.suites[run.run_id]
        t0 = time.perf_counter()
        try:
            findings = suite.update(record)
        except Exception:  # a detector bug must never cost a stored record
            self.metrics.detector_errors.inc()
            log.exception("detector failed on %s step %s", record.run_id, record.step)
            findings = []
        self.metrics.detector_duration.observe(time.perf_counter() - t0)
        if isinstance(record, StepRecord):
            run.rank(record.rank).loss_ema = suite.ema_loss(record.rank)
        return findings

    def _handle_findings(
        self, run: RunState, findings: list[Finding], now: float, result: IngestResult
    ) -> None:
        run.count_findings(findings)
        result.findings.extend(findings)
        result.actions.extend(self.alerts.handle(self._context(run), findings, now))

    def _finish(self, result: IngestResult) -> None:
        if result.findings:
            self.store.insert_findings([f.to_dict() for f in result.findings])
        m = self.metrics.records
        m.labels(outcome="accepted").inc(result.accepted)
        m.labels(outcome="duplicate").inc(result.duplicates)
        m.labels(outcome="late").inc(result.late)

    def _context(self, run: RunState) -> RunContext:
        config = run.run.config if run.run is not None else {}
        return RunContext(
            run_id=run.run_id, project=run.project or None, labels=run.labels, config=config
        )

    # -- runs in memory -------------------------------------------------------------------

    def _run(self, run_id: str, now: float) -> RunState | None:
        run = self.runs.get(run_id)
        if run is not None:
            return run
        if len(self.runs) >= self.settings.max_active_runs:
            return None
        return self._load_run(run_id, now)

    def _load_run(self, run_id: str, now: float) -> RunState:
        """Bring a run into memory: fresh, or rebuilt from its snapshot and stored tail."""
        run = RunState.new(run_id, now)
        suite = DetectorSuite(self.settings.detectors)
        self.runs[run_id] = run
        self.suites[run_id] = suite
        try:
            self._restore(run, suite, now)
        except (sqlite3.Error, StorageError) as exc:
            self._evict(run_id)
            raise StorageError(f"cannot restore run {run_id}: {exc}") from exc
        self._reanalyse.discard(run_id)
        return run

    def _restore(self, run: RunState, suite: DetectorSuite, now: float) -> None:
        """Load the run's snapshot, then replay the records stored after it through the very
        same path as live ones; alerting's durable state keeps them from paging twice."""
        after = recovery.restore_run(self.store, run, suite, now)
        if after is None:
            return  # never stored: a new run
        result, arrival, replayed = IngestResult(), run.last_arrival, 0
        for row_id, record in recovery.stored_tail(self.store, run.run_id, after):
            self._process(record, row_id, now, result, arrival=arrival)
            replayed += 1
        if result.findings:
            self.store.insert_findings([f.to_dict() for f in result.findings])
        log.info("run %s: restored, replayed %d records", run.run_id, replayed)

    def recover(self, now: float) -> int:
        """Reload the runs that were active before a restart; return how many."""
        count = 0
        for row in self.store.runs():
            live = now - row.last_seen < self._ttl(row.status)
            if live and len(self.runs) < self.settings.max_active_runs:
                self._load_run(row.run_id, now)
                count += 1
        return count

    def _ttl(self, status: str) -> float:
        if status == "running":
            return self.settings.silent_run_ttl_seconds
        return self.settings.ended_run_ttl_seconds

    # -- clock-driven work ----------------------------------------------------------------

    def tick(self, now: float) -> list[Finding]:
        """Stall checks, alert resolves, expiry, snapshots and retention; call every second."""
        self._reload_evicted(now)
        findings: list[Finding] = []
        for run in list(self.runs.values()):
            findings.extend(self._tick_run(run, now))
        if findings:
            self.store.insert_findings([f.to_dict() for f in findings])
        self.alerts.tick(now)
        self._expire(now)
        if now - self._last_snapshot >= self.settings.snapshot_interval_seconds:
            self.snapshot_all()
            self._last_snapshot = now
        self.retention.prune_some(self.runs)
        self._count_runs()
        return findings

    def _reload_evicted(self, now: float) -> None:
        """Analyse again the runs whose effects could not be committed, once storage works;
        a failure leaves the rest of the tick (stalls, resolves, snapshots) to run."""
        for run_id in list(self._reanalyse):
            if run_id in self.runs or len(self.runs) >= self.settings.max_active_runs:
                continue
            try:
                self._load_run(run_id, now)
            except StorageError:
                return  # still failing; readiness says so; next tick again
            except Exception:  # a bug must not block every tick: the record stays stored
                log.exception("cannot analyse run %s again; it reloads on its next record",
                              run_id)
                self._reanalyse.discard(run_id)
                self.runs.pop(run_id, None)
                self.suites.pop(run_id, None)

    def _tick_run(self, run: RunState, now: float) -> list[Finding]:
        if run.status != "running" or not run.ranks:
            return []
        last_time = max((r.last.time for r in run.ranks.values() if r.last), default=None)
        if last_time is None:
            return []
        # Map sidecar time onto the run's clock: immune to client/sidecar clock skew.
        record_now = last_time + (now - run.last_arrival)
        try:
            found = self.suites[run.run_id].tick(record_now)
        except Exception:
            self.metrics.detector_errors.inc()
            log.exception("detector tick failed for %s", run.run_id)
            return []
        if found:
            result = IngestResult()
            self._handle_findings(run, found, now, result)
        return found

    def _expire(self, now: float) -> None:
        for run in list(self.runs.values()):
            if now - run.last_arrival > self._ttl(run.status):
                self._snapshot(run)
                del self.runs[run.run_id]
                del self.suites[run.run_id]

    def snapshot_all(self) -> None:
        for run in list(self.runs.values()):
            if run.last_record_id > run.snapshot_record_id:
                self._snapshot(run)

    def _snapshot(self, run: RunState) -> None:
        state = recovery.snapshot_run(run, self.suites[run.run_id])
        self.store.save_detector_state(run.run_id, run.last_record_id, wire.dumps(state))
        run.snapshot_record_id = run.last_record_id

    def _count_runs(self) -> None:
        counts = {"running": 0, "ended": 0}
        for run in self.runs.values():
            counts["running" if run.status == "running" else "ended"] += 1
        for state, value in counts.items():
            self.metrics.runs.labels(state=state).set(value)

    # -- queries (engine thread) ---
    # The API calls these only through ``EngineRunner.call``: run state is read on the
    # thread that writes it, and what leaves is a copy (pipeline/views.py), never live state.

    def exposed_runs(self) -> list[RunState]:
        """The runs /metrics renders. The one query called from another thread (the
        scrape's worker): ``list(dict.values())`` is one C-level copy, atomic under the
        GIL, and the renderer caches each run by its ``version``. Rendering on the engine
        thread instead would hold ingest for the whole render (~100 ms at 100k series,
        bench/exposition.py)."""
        return list(self.runs.values())

    def run_listings(self) -> list[run_views.RunListing]:
        """Every stored run, oldest first (``GET /v1/runs``)."""
        return [run_views.listing(row, self.runs.get(row.run_id)) for row in self.store.runs()]

    def run_summaries(self) -> list[run_views.RunSummary]:
        """Every stored run with its progress and worst finding (the runs page)."""
        out = []
        for row in self.store.runs():
            live = self.runs.get(row.run_id)
            last = None
            if live is None:
                body = self.store.last_record(row.run_id, 0, "step")
                last = wire.loads(body).get("step") if body is not None else None
            severities = self.store.finding_severity_counts(row.run_id)
            out.append(run_views.summary(row, live, severities, last))
        return out

    def run_detail(self, run_id: str) -> run_views.RunDetail | None:
        """A run's status, ranks and findings (``GET /v1/runs/{id}``); None: no such run."""
        row = self.store.run_row(run_id)
        if row is None:
            return None
        return run_views.detail(row, self.runs.get(run_id), self.store.finding_counts(run_id),
                                self.store.findings(run_id, limit=20))

    def stored_records(self, run_id: str, since_step: int, limit: int,
                       kinds: Sequence[str]) -> list[bytes] | None:
        """A run's stored record lines, oldest step first; None when the run is unknown."""
        bodies = self.store.records(run_id, since_step, limit, kinds)
        if not bodies and self.store.run_row(run_id) is None:
            return None
        return bodies

    def stored_findings(self, run_id: str, limit: int) -> list[bytes]:
        """A run's stored finding lines, newest first."""
        return self.store.findings(run_id, limit)

    def check_writable(self, headroom_bytes: int) -> None:
        """Raise StorageError unless the store can take ``headroom_bytes`` more now."""
        self.store.check_writable(headroom_bytes)


def _bare_context(record: Record) -> RunContext:
    return RunContext(run_id=record.run_id)


def _row(item: Incoming) -> RecordRow:
    record = item.record
    return RecordRow(
        run_id=record.run_id,
        rank=record.rank,
        kind=record.kind,
        step=record.step,  # a run record's is -1: it sorts before every step
        time=record.time,
        body=item.body,
    )
