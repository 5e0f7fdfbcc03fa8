"""A record's walk through the per-record stages, in order: (admit and store are the
batch's, pipeline/engine.py) apply -> detect -> judge -> route. The same walk feeds a
restored run its stored tail (``replay``), in another ``Mode``: nothing about detection
exists only in the live path.

Which stages a record reaches depends on what it is: a record of a new attempt not settled
yet is kept (pipeline/attempts.py), a checkpoint goes to the run's ledger, a replaced
attempt's record from a job still running is judged apart (``Detection.rival``), history
sent again or out of order is only stored; the rest are applied, detected, judged and
routed. Every record of a followed run also goes to its leader as a digest
(``Router.forward``)."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

from monitor_agent.alerting.sink import AlertSink
from monitor_agent.pipeline import recovery
from monitor_agent.pipeline.apply import StateApply
from monitor_agent.pipeline.batch import LIVE, Admitted, IngestResult, Mode
from monitor_agent.pipeline.batch_end import BatchEnd
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.detect import Detection
from monitor_agent.pipeline.judge import Judge
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.pipeline.routing import Router
from monitor_agent.records.types import CheckpointRecord, EvalRecord, Record, StepRecord
from monitor_agent.runs.lifecycle import RunLifecycle
from monitor_agent.storage.store import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class KeptRecord:
    """A stored record about to walk the stages: its row, the attempt it came from,
    whether a later attempt already replaced it (pipeline/attempts.py: stored as history,
    never analysed), its stored JSON (forwarded as a digest when this sidecar follows the
    run's leader) and ``origin``, the node whose sidecar forwarded it here, the leader
    (None: this sidecar's own client's)."""

    record: Record
    row_id: int
    attempt: int = 1
    superseded: bool = False
    body: bytes | None = None
    origin: int | None = None

    @classmethod
    def of_admitted(cls, entry: Admitted, row_id: int) -> KeptRecord:
        return cls(entry.item.record, row_id, entry.attempt, entry.superseded_by is not None,
                   entry.item.body, entry.item.origin)

    @classmethod
    def of_stored(cls, row: recovery.StoredRecord) -> KeptRecord:
        return cls(row.record, row.row_id, row.attempt, False, row.body, row.origin)


class RecordWalk:
    """Walks each stored record through the stages of its run."""

    def __init__(self, store: Store, alerts: AlertSink, registry: RunRegistry,
                 placement: Placement, consequences: Consequences, state: StateApply,
                 detection: Detection, judge: Judge, router: Router,
                 batch_end: BatchEnd) -> None:
        self.store = store
        self.alerts = alerts
        self.registry = registry
        self.placement = placement
        self.consequences = consequences
        self.state = state
        self.detection = detection
        self.judge = judge
        self.router = router
        self.batch_end = batch_end
        self.replayed = 0  # stored records fed again to rebuild runs (the tests count them)

    def walk(self, live: LiveRun, kept: KeptRecord, now: float, result: IngestResult,
             mode: Mode = LIVE) -> None:
        """One record through the stages its kind and its attempt let it reach."""
        run, record = live.state, kept.record
        run.last_record_id = max(run.last_record_id, kept.row_id)
        run.goodput.feed(record, kept.attempt, kept.row_id)  # every record, replaced too
        if not self._judged(live, kept, now, result, mode):
            self.router.forward(run, record, kept.body, result, mode, kept.origin)
            return
        if isinstance(record, StepRecord):
            record = self.state.cap_layers(run, record)
        self.state.apply(live, record, mode.arrived(now), kept.origin, kept.attempt)
        self.router.forward(run, record, kept.body, result, mode, kept.origin)
        findings = [dataclasses.replace(f, attempt=kept.attempt)
                    for f in self.detection.detect(live, record, kept.origin is not None)]
        # Before routing: a page names the checkpoint judged with it.
        self.judge.judge(live, record, findings, now, result, decides=not mode.quiet)
        if findings and mode.quiet:
            run.count_findings(findings)
        elif findings:
            self.router.route(run, findings, now, result, kept.origin)
        if not mode.quiet:
            self.consequences.decide_deferred_rollback(run, now, result)

    def _judged(self, live: LiveRun, kept: KeptRecord, now: float, result: IngestResult,
                mode: Mode) -> bool:
        """Whether the record goes on to be applied and judged as the run's history; a
        record that does not is dealt with here (kept, ledgered, judged apart, or only
        counted late) and only forwarded after."""
        run, record, attempt = live.state, kept.record, kept.attempt
        if attempt > live.attempts.owner:
            # A new attempt not settled yet (its run record, or the end of a process that
            # died before its first step): held, applied when it settles (attempts.py).
            return False
        if isinstance(record, CheckpointRecord):
            if not kept.superseded:
                self.state.checkpoint(run, record, attempt)
            return False
        if kept.superseded and mode.live:
            found = self.detection.rival(live, record, attempt, kept.origin is not None)
            if found is not None:
                result.late += 1  # history, as the run's reads see it
                if found:
                    self.router.route(run, found, now, result, kept.origin)
                return False
        if kept.superseded or (isinstance(record, StepRecord | EvalRecord)
                               and run.is_late(record)):
            # Out-of-order or re-sent history: stored, but detectors only see time forward.
            result.late += 1
            return False
        return True

    def replay(self, live: LiveRun, after: int, now: float, quiet: bool = False) -> None:
        """Feed a restored run the records stored after its snapshot, through the very
        same path as live ones; alerting's durable state keeps them from paging twice.
        ``quiet`` (a run rebuilt for a new attempt, registry.py): state only; the records
        were judged, their findings stored and paged about, when they first arrived."""
        result, arrival, replayed = IngestResult(), live.state.last_arrival, 0
        # Its lifecycle goes on from what is durable: the store's status, alerting's open
        # actions (a rollback decided and not yet applied, a stop not yet honoured).
        live.lifecycle = RunLifecycle(live.state.status)
        live.lifecycle.acted(self.alerts.open_actions(live.run_id))
        live.state.phase = live.lifecycle.describe()
        live.state.phase_state = live.lifecycle.phase.value
        self.consequences.publish_rollback(live)
        if after or live.attempts.owner > 1:
            self.placement.restore(live, carried_only=not after)
        self._catch_up_goodput(live, after)
        mode = Mode.replay(arrival, quiet)
        for row in recovery.stored_tail(self.store, live.run_id, after):
            self.walk(live, KeptRecord.of_stored(row), now, result, mode)
            replayed += 1
            if quiet:  # effects durable already: snapshots as it goes (registry.rebuild)
                self.registry.snapshot_advanced(live, now)
        self.replayed += replayed
        self.batch_end.finish(result)
        if not quiet:
            self.consequences.reconcile(live, now)
        # A rollback rebuilt the verdict from what is left of the history: the row says so
        # too, the moment it happens or, after a kill -9 in between, on the next load.
        self.consequences.store_verdict(live.state)
        log.info("run %s: restored, replayed %d records", live.run_id, replayed)

    def _catch_up_goodput(self, live: LiveRun, after: int) -> None:
        """Feed the run's goodput ledger every record stored after its own saved position
        (``after``, the detectors' snapshot, for a ledger never kept): the ones a later
        attempt replaced too, which the detectors' replay leaves out. Kept less often than
        the records come (with the snapshots), a ledger restored after a kill -9 would
        otherwise never see the abandoned branch's records stored after it was kept, and
        charge less of it to the resume than the ledger that saw them live. A rebuild's
        ledger (carried over) has seen them all: nothing to feed."""
        book = live.state.goodput
        start = book.last_row or after
        for row in recovery.stored_tail(self.store, live.run_id, start, replaced=True):
            book.feed(row.record, row.attempt, row.row_id)
