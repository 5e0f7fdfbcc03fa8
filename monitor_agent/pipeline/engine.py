"""record -> store -> detectors -> alerting -> run state: the one pipeline, live and offline.

The engine is synchronous and single-threaded by contract: the app calls it from one worker
thread, the trace judge (trace_judge.py) inline with the records' clock. Nothing about detection exists only in
the live path. Its one job is feeding records (and the clock) through each run; the runs
in memory belong to ``registry.RunRegistry`` and the API's questions to
``reads.queries.RunQueries``.

The engine sees no wire models: the edge (the API, the trace judge) validates with ``schemas`` and
hands it ``Incoming`` records, the ``types`` dataclass plus the JSON to store.

Three steps of a run, the last with a NaN loss, then the same batch again (a client's
retry: idempotent)::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.records import schemas
    >>> engine = Engine(Settings(), Store(":memory:"), SelfMetrics(CollectorRegistry()))
    >>> lines = [{"kind": "step", "run_id": "r1", "step": s, "time": 1000.0 + s,
    ...           "loss": 2.0 if s < 3 else float("nan")} for s in (1, 2, 3)]
    >>> items = [Incoming(i, *schemas.parse_for_store(obj)) for i, obj in enumerate(lines)]
    >>> result = engine.ingest(items, now=1003.0)
    >>> result.accepted, [f.type for f in result.findings]
    (3, ['nan_inf'])
    >>> engine.ingest(items, now=1004.0).duplicates
    3
    >>> engine.tick(now=1005.0)
    []
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.alerting.plan_check import RunBounds
from monitor_agent.alerting.sink import AlertSink, NullSink
from monitor_agent.cluster.digest import digest
from monitor_agent.cluster.drain import NodeDrain
from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.cluster.placement import leader_of
from monitor_agent.cluster.roster import Roster
from monitor_agent.detectors import DetectorSuite, relaunched, two_jobs
from monitor_agent.detectors.catalogue import RUN_SCOPED_TYPES
from monitor_agent.detectors.support.context import SkipPlan, host_label
from monitor_agent.metrics import names as metric_names
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import recovery
from monitor_agent.pipeline.admission import AdmissionBudget
from monitor_agent.pipeline.attempts import AttemptWaits, holds_history
from monitor_agent.pipeline.failpoints import Failpoints
from monitor_agent.pipeline.layer_cap import cap_layers
from monitor_agent.pipeline.plausible import forged_rank, implausible_step
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.pipeline.retention import Retention
from monitor_agent.records import schemas, wire
from monitor_agent.records.actions import RESTART_ACTIONS, Action
from monitor_agent.records.types import (
    AgreementRecord,
    CheckpointRecord,
    EndRecord,
    EvalRecord,
    Finding,
    Record,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs import attempt_end
from monitor_agent.runs.attempt_end import AttemptEnd
from monitor_agent.runs.checkpoint_ledger import CHECKPOINT_STEP_SLACK, LedgerEntry
from monitor_agent.runs.ettr import ettr_of, recovery_words
from monitor_agent.runs.goodput import STRAGGLER_CAUSES, cost_words
from monitor_agent.runs.lifecycle import (
    AttemptSettled,
    Ended,
    Event,
    Restarted,
    RolledBack,
    RunLifecycle,
)
from monitor_agent.runs.run_state import RunState
from monitor_agent.runs.verdict import Verdict
from monitor_agent.settings import Settings
from monitor_agent.storage.database import StorageError
from monitor_agent.storage.store import RecordRow, Store, StoredAttempt, StoredCheckpoint
from monitor_agent.storage.uplink import (
    CLOSED,
    DROPPABLE,
    LOCAL_VIEW,
    PAGED,
    VITAL,
    UplinkItem,
    UplinkRow,
)

log = logging.getLogger(__name__)

MAX_RIVALS = 64  # replaced attempts still sending, judged at once (``Engine._rival``)


@dataclass(frozen=True, slots=True)
class Incoming:
    """A validated record, its index in the request, and the JSON the store keeps for it
    (the client's own line, or ``schemas.stored_json``)."""

    index: int
    record: Record
    body: bytes
    # The node rank of the sidecar that forwarded it to this one, the run's leader, as a
    # digest (monitor_agent/cluster); None for a record of this sidecar's own client.
    origin: int | None = None


@dataclass(frozen=True, slots=True)
class PeerRun:
    """A run a node sidecar follows, as it reports it: the node its ranks run on (their
    run records' ``cluster.node_rank``), that node's host and the ranks it hears."""

    run_id: str
    node: int
    host: str | None = None
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class PeerBatch:
    """What a node sidecar sends its run leader in one exchange (api/peer.py): the
    digests of its ranks' records (``Incoming.origin``: their node), its detectors'
    findings (each with its ``storage.uplink`` flags) and the runs it follows (its
    heartbeat)."""

    sidecar: str
    items: list[Incoming] = field(default_factory=list)
    findings: list[tuple[Finding, int]] = field(default_factory=list)
    runs: Sequence[PeerRun] = ()
    address: str | None = None  # the connection's (api/peer.py), not the body's word

    @property
    def forwarder(self) -> str:
        """Who forwards: the node sidecar's id at the address it connects from."""
        return f"{self.sidecar}@{self.address or '?'}"


@dataclass(slots=True)
class IngestResult:
    """What happened to each record of a batch, as the API reports it."""

    accepted: int = 0
    duplicates: int = 0
    late: int = 0
    rejected: list[dict[str, Any]] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # (run id, token) -> the attempt its records went to (``attempt_view``), per batch.
    attempts: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    # What this node sidecar owes the run leaders it follows (monitor_agent/cluster).
    uplink: list[UplinkRow] = field(default_factory=list)
    resumed: bool = False  # a record of the batch settled a resumed or restarted attempt
    # A node sidecar's exchange (``ingest_peer``): runs whose items were left with it, and
    # why; the findings taken, and those refused (index into the exchange's findings).
    deferred: dict[str, str] = field(default_factory=dict)
    taken: int = 0
    rejected_findings: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Admitted:
    """A record let in, with the attempt of its run it belongs to (pipeline/attempts.py)
    and the later attempt that already replaced it, if any (a spool delivered late)."""

    item: Incoming
    attempt: int
    superseded_by: int | None


class Engine:
    """Drives records and the clock through each run; findings go to ``alerts``
    (``NullSink``, the default, pages nobody). The runs themselves live in ``registry``."""

    def __init__(
        self, settings: Settings, store: Store, metrics: SelfMetrics,
        alerts: AlertSink | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.alerts: AlertSink = alerts if alerts is not None else NullSink()
        self.registry = RunRegistry(settings, store, replay=self._replay)
        self.retention = Retention(store, settings.retention_steps)
        self._last_snapshot = 0.0
        # How each run leader this sidecar forwards to is answering (cluster/link.py
        # writes it; routing a finding reads it).
        self.links = LinkBook(settings.cluster.peer_timeout_seconds)
        self._ticked = IngestResult()  # what a tick owes the leaders, queued at its end
        self.replayed = 0  # stored records fed again to rebuild runs (the tests count them)
        # (run id, attempt) -> the detectors of a replaced attempt still sending (``_rival``)
        self._rivals: dict[tuple[str, int], DetectorSuite] = {}
        # (run id, attempt) of new attempts held back and paged as a second job (_held_back)
        self._held_told: dict[tuple[str, int], None] = {}
        self.failpoints = Failpoints(settings.failpoint)
        self.alerts.cost_with(self._incident_cost)
        # This sidecar's id (cluster/identity.py) and its node's drain (cluster/drain.py),
        # set by the app: a decision that leaves this node out drains it.
        self.identity = ""
        self.node_drain: NodeDrain | None = None

    # -- ingest ---------------------------------------------------------------------------

    def ingest(self, items: Sequence[Incoming], now: float,
               source: str | None = None) -> IngestResult:
        """Store a validated batch in one transaction, then run it through detection.

        Raises StorageError (-> 503) when the records, or anything they cause (findings,
        alert state), could not be made durable. In the latter case the records are stored
        but their runs leave memory: reloading replays them from the store (on the client's
        retry, the next tick or a restart), so a page is never lost to a failed commit.
        Any other exception after the commit does the same and leaves as it is (-> 500):
        a record is acknowledged only once its alert state is durable, whatever failed.
        """
        result = IngestResult()
        admitted = self._admit(items, result, now, source)
        rows = [_row(a.item, a.attempt, a.superseded_by) for a in admitted]
        t0 = time.perf_counter()
        ids = self.store.insert_records(rows)
        self.metrics.store_duration.observe(time.perf_counter() - t0)
        if result.resumed:
            self.failpoints.reached("records_stored")
        try:
            for entry, row_id in zip(admitted, ids, strict=True):
                live = self.registry.get(entry.item.record.run_id)
                assert live is not None  # admitted just now, on this thread
                if isinstance(entry.item.record, StepRecord):  # stored: its rank trains here
                    live.attempts.stepped.add((entry.attempt, entry.item.record.rank))
                if row_id is None:
                    result.duplicates += 1
                    continue
                result.accepted += 1
                self._process(live, entry.item.record, row_id, now, result,
                              attempt=entry.attempt,
                              superseded=entry.superseded_by is not None,
                              body=entry.item.body, origin=entry.item.origin)
            self._finish(result)
            self._open_actions({a.item.record.run_id for a in admitted}, result)
        except Exception as exc:
            # Kept in memory, the runs would count these records as judged and the retry
            # as a duplicate: the page would be lost. Evicted, they are judged again.
            for run_id in {a.item.record.run_id for a in admitted}:
                self.registry.evict(run_id)
            if isinstance(exc, StorageError):
                raise StorageError(f"records stored, their alerts not: {exc}") from exc
            raise
        for run_id in {a.item.record.run_id for a in admitted}:  # their effects are durable
            self.registry.snapshot_advanced(self.registry.get(run_id), now)
        return result

    def preview(self, items: Sequence[Incoming], now: float) -> int:
        """Page now about NaN/Inf steps sent ahead of their backlog (``POST
        /v1/records/preview``); return how many alerts that began.

        Nothing is stored and no detector state changes: the step's in-order copy, when the
        backlog reaches it, is stored and judged like any other and its finding folds into
        the alert begun here (``Alerting.preview``). A stored run not in memory is paged
        about with what the record carries (its id, rank and step) and is not loaded for it;
        such runs count against ``max_new_runs_per_request`` as ingest's do (each costs a
        detector suite and may begin an alert), and the records of runs past it are not
        previewed: their in-order copies page as usual. A run the sidecar never stored
        pages nothing: a preview pages only about runs that ingest admitted (under
        ``max_active_runs``), so made-up run ids cannot fill the outbox ahead of real pages;
        its in-order copy pages as any record does.
        """
        begun = 0
        budget = AdmissionBudget(self.settings)
        for item in items:
            record = item.record
            if not isinstance(record, StepRecord):
                continue
            live = self.registry.get(record.run_id)
            if live is None:
                if self.store.run_row(record.run_id) is None:
                    continue
                if budget.refuse_run(record.run_id) is not None:
                    continue
                budget.took_run(record.run_id)
            if live is not None and live.state.is_late(record):
                continue  # its in-order copy was judged already
            suite = live.suite if live is not None else DetectorSuite(self.settings.detectors)
            findings = suite.preview(record)
            leader = self._following(live.state) if live is not None else None
            if findings and leader is not None:
                if not self.links.lost(leader, now):
                    continue  # the run's leader pages it, from the digest on its way there
                findings = [f.seen_partially(self.links.why(leader, now)) for f in findings]
            elif findings and live is not None and self._leads(live.state):
                # Its in-order copy is judged with every node's ranks (which rank went NaN
                # first), and what a node sidecar paged while this one was away arrives with
                # the node's digests: one rank's preview would page that rank as the origin,
                # and page again what the node paged (a restarted leader's ranks preview
                # their spooled NaN steps before the node has caught it up).
                continue
            if findings:
                context = _context(live.state) if live is not None else _bare_context(record)
                begun += self.alerts.preview(context, findings, now)
        return begun

    def _admit(
        self, items: Sequence[Incoming], result: IngestResult, now: float,
        source: str | None = None,
    ) -> list[_Admitted]:
        admitted: list[_Admitted] = []
        seen: dict[tuple[str, int], int] = {}  # the batch's own steps count as history
        paths: dict[tuple[str, int, int], str] = {}  # the batch's own checkpoints
        stepped: set[tuple[str, int, int]] = set()  # (run, attempt, rank) of its steps
        budget = AdmissionBudget(self.settings)
        for item in items:
            record = item.record
            new = self.registry.get(record.run_id) is None
            reason, label = (budget.refuse_run(record.run_id) if new else None), "too_many_new_runs"
            if reason is None:
                live = self.registry.admit(record.run_id, now)
                if live is None:
                    reason = (f"too many active runs (max_active_runs="
                              f"{self.settings.max_active_runs}, none silent for run_displace_"
                              f"after_seconds={self.settings.run_displace_after_seconds:g}); "
                              "retry later")
                    label = "too_many_runs"
                else:
                    if new:
                        budget.took_run(record.run_id)
                        # Where a run came from (the request's peer): a flood of made-up
                        # runs is budgeted per source in the outbox (notify/fairness.py).
                        live.state.source = live.state.source or source
                    reason, label = self._refused(live, item, seen, stepped, budget, now)
            if reason is not None:
                result.rejected.append({"index": item.index, "reason": reason})
                self.metrics.rejections.labels(reason=label).inc()
                continue
            assert live is not None
            entry = self._attempt(live, item, result, now)
            if isinstance(entry, str):
                result.rejected.append({"index": item.index, "reason": entry})
                self.metrics.rejections.labels(reason="too_many_attempts").inc()
                continue
            if isinstance(record, StepRecord):
                stepped.add((record.run_id, entry.attempt, record.rank))
            if isinstance(record, CheckpointRecord):
                clash = _checkpoint_clash(live, record, entry.attempt, paths)
                if clash is not None:
                    result.rejected.append({"index": item.index, "reason": clash})
                    self.metrics.rejections.labels(reason="checkpoint").inc()
                    continue
            admitted.append(entry)
        return admitted

    def _refused(self, live: LiveRun, item: Incoming, seen: dict[tuple[str, int], int],
                 stepped: set[tuple[str, int, int]], budget: AdmissionBudget,
                 now: float) -> tuple[str | None, str]:
        """Why a record may not join its run, and the label it is counted under; (None,
        "") when it may. The same checks for a record of this sidecar's own client and
        for a digest a node sidecar forwarded (docs/hostile-input.md, "Every door")."""
        record, run = item.record, live.state
        reason = budget.refuse_rank(run, record.rank)
        if reason is not None:
            return reason, "too_many_ranks"
        if isinstance(record, CheckpointRecord):
            reason = _future_checkpoint(run, record, seen) or \
                live.attempts.writer(record, stepped)
            return reason, "checkpoint"
        reason = implausible_step(run, record, seen, self.settings.max_step_jump, now)
        if reason is not None:
            return reason, "implausible_step"
        reason = forged_rank(run, record, stepped)
        if reason is None and isinstance(record, AgreementRecord) and run.leader is None \
                and not self.alerts.took_action(run.run_id, record.action_id, record.action):
            # The sidecar that decides the run's actions knows each one; a node sidecar
            # (``run.leader``) may lack one (that is what the record may say): its leader
            # checks the digest.
            reason = (f"action_id: run {run.run_id} has no {record.action} action "
                      f"{record.action_id}: an agreement record is about an action the "
                      "run's sidecar decided")
        return reason, "forged_rank"

    def _attempt(self, live: LiveRun, item: Incoming, result: IngestResult,
                 now: float) -> _Admitted | str:
        """The attempt ``item`` belongs to (pipeline/attempts.py), or why it may not begin
        one: a new token is placed (stored at once, so a retry finds it), and a pending
        attempt settles on its first step or eval; one that replaced history reloads the
        run from what is left of it."""
        record = item.record
        # A digest settles as it settled on its node's sidecar, which held its own ranks
        # to the rule (pipeline/attempts.py ``holds_history``).
        held = self._holds_history(live, now) if item.origin is None else None
        try:
            placed = live.attempts.place_record(self.store, record, now,
                                                self.settings.max_attempts_per_run, held,
                                                item.origin is None and _moved(live, record))
        except AttemptWaits as exc:
            self._held_back(live, record, exc.attempt, now)
            raise
        if isinstance(placed, str):
            return placed
        token, number, settled = placed
        book = live.attempts
        live.state.attempt = max(book.current, 1)
        live.state.relaunching = book.get(book.current).kind == "pending"
        if settled is not None and settled.kind != "first":
            log.info("run %s: attempt %d %s from step %d", record.run_id, number,
                     settled.kind, record.step)
            before = live.state
            launcher = before.run.launcher if before.run is not None else None
            crashed = (before.status in ("running", "failed") and not before.hung_ranks
                       and launcher is not None and launcher.restarts,
                       before.last_step, now - before.last_arrival,
                       before.status == "failed")  # it said so: its crash was paged
            ended = self._how_ended(live, number) if crashed[0] else None
            live = self.registry.rebuild(record.run_id, now)
            live.suite.ctx.attempt_began = record.time  # its ranks start now (hang.py)
            # The ledger begins the attempt at the record that settles it, which it is fed
            # only later: the pages the settle closes say what the restart cost.
            if record.time is not None:
                live.state.goodput.begin(number, record.time)
            book = live.attempts
            self.failpoints.reached("attempt_settled")
            events = live.lifecycle.settled(settled)
            self._lifecycle(live, events, now)
            self.failpoints.reached("rollback_applied")
            result.resumed = True
            if crashed[0] and not any(isinstance(e, RolledBack | Restarted) for e in events):
                self._relaunched(live, settled, crashed[1], crashed[2], crashed[3], now,
                                 result, ended)
        key, view = (record.run_id, token), result.attempts.get((record.run_id, token))
        if view is None or view["number"] != number or view["kind"] == "pending":
            result.attempts[key] = attempt_view(record.run_id, book.get(number))
        return _Admitted(item, number,
                         book.superseded_by(number, record.kind, record.step))

    def _how_ended(self, live: LiveRun, number: int) -> AttemptEnd | None:
        """How the attempt that attempt ``number`` replaces ended, rank by rank, and which
        of its ranks died without a word (runs/attempt_end.py), from the end records
        stored for it: read before the rebuild, while the run still knows its ranks'
        nodes and their addresses."""
        book = live.attempts
        ended = max((a.number for a in book.attempts if a.number < number
                     and a.kind != "pending"), default=None)
        if ended is None:
            return None
        run = live.state
        ranks = {r for n, r in book.stepped if n == ended}
        return attempt_end.judge(ended, ranks, self.store.rank_ends(run.run_id, ended),
                                 run.hosts(), _addresses(run))

    def _relaunched(self, live: LiveRun, attempt: StoredAttempt, last_step: int, gap: float,
                    said_crash: bool, now: float, result: IngestResult,
                    ended: AttemptEnd | None = None) -> None:
        """Page that the job's launcher relaunched it after a crash (an attempt with no end
        record, or a failed one, no hang open, and a launcher its ranks said runs them
        again: detectors/relaunched.py), where the run is judged (a node sidecar leaves it
        to the leader, which sees the attempt too). A crash its ranks reported
        (``said_crash``: a failed end, paged ``crashed``) is the same incident: its alert
        resolves saying it was relaunched, one page, not two. Either says how the ended
        attempt's ranks ended (``ended``): the rank that died without a word, and its node's
        verdict (runs/node_verdict.py, ``gone``), not the peers that lost it."""
        if relaunched.RelaunchedDetector.type in self.settings.detectors.disabled or \
                self._following(live.state) is not None:
            return
        found = relaunched.finding(live.run_id, attempt.number, attempt.start_step or 0,
                                   last_step if last_step >= 0 else None, gap,
                                   said_crash=said_crash,
                                   ended=ended.words() if ended is not None else "",
                                   evidence=ended.evidence() if ended is not None else None)
        # Named here, for the resolve of a crash page too; routing it names it no more.
        found = _name_nodes(live.state, [found])[0]
        if said_crash and self.alerts.relaunched(live.run_id, found.message,
                                                 attempt.start_step or 0, now):
            return
        self._route(live.state, [found], now, result)

    def _holds_history(self, live: LiveRun, now: float) -> str | None:
        """Why the run's current attempt may not be replaced now (``holds_history``)."""
        run = live.state
        return holds_history(run.run_id, live.attempts.owner,
                             live.lifecycle.expects_new_attempt, now - run.last_arrival,
                             _step_interval(run), self.settings.attempt_quiet_seconds)

    def _held_back(self, live: LiveRun, record: Record, attempt: int, now: float) -> None:
        """A new attempt still refused once it has waited as long as a job stops in: two
        jobs write the run id. Paged once (``two_jobs``); the one that was there keeps
        the history, and the other's records are refused until it stops."""
        began = live.attempts.get(attempt).started_at
        key = (record.run_id, attempt)
        if now - began < self.settings.attempt_quiet_seconds or key in self._held_told or \
                two_jobs.TwoJobsDetector.type in self.settings.detectors.disabled:
            return
        if len(self._held_told) >= MAX_RIVALS:
            self._held_told.pop(next(iter(self._held_told)))
        self._held_told[key] = None
        result = IngestResult()
        finding = two_jobs.held(record, live.attempts.owner, attempt, now - began)
        self._route(live.state, [finding], now, result)
        self._finish(result)

    def _process(
        self,
        live: LiveRun,
        record: Record,
        row_id: int,
        now: float,
        result: IngestResult,
        arrival: float | None = None,
        attempt: int = 1,
        superseded: bool = False,
        quiet: bool = False,
        body: bytes | None = None,
        origin: int | None = None,
    ) -> None:
        """``arrival`` is when the record reached us (``now`` unless replaying the store);
        ``attempt`` the run's attempt it came from; ``superseded`` when a later attempt
        already replaced it (pipeline/attempts.py): stored as history, never analysed.
        ``body`` is its stored JSON (forwarded as a digest when this sidecar follows the
        run's leader); ``origin`` the node whose sidecar forwarded it here, the leader
        (None: this sidecar's own client's)."""
        run = live.state
        run.last_record_id = max(run.last_record_id, row_id)
        run.goodput.feed(record, attempt, row_id)  # every record, superseded ones too
        if attempt > live.attempts.owner:
            # A new attempt not settled yet (its run record, or the end of a process that
            # died before its first step): held, applied when it settles (attempts.py).
            self._forward(run, record, body, result, quiet, origin)
            return
        if isinstance(record, CheckpointRecord):
            if not superseded:
                self._checkpoint(run, record, attempt)
            self._forward(run, record, body, result, quiet, origin)
            return
        if superseded and arrival is None and not quiet and \
                self._rival(live, record, attempt, now, result, origin):
            self._forward(run, record, body, result, quiet, origin)
            return
        if superseded or (isinstance(record, StepRecord | EvalRecord) and run.is_late(record)):
            # Out-of-order or re-sent history: stored, but detectors only see time forward.
            result.late += 1
            self._forward(run, record, body, result, quiet, origin)
            return
        if isinstance(record, StepRecord):
            record = self._cap_layers(run, record)
        self._apply(live, record, now if arrival is None else arrival, origin, attempt)
        self._forward(run, record, body, result, quiet, origin)
        findings = [dataclasses.replace(f, attempt=attempt)
                    for f in self._detect(live, record, origin is not None)]
        judged = False
        for f in findings:  # before alerting: a page names the checkpoint judged with it
            if run.ledger.observe(f):
                run.version += 1
                judged = True
        pending = live.lifecycle.rollback
        if judged and pending is not None and not quiet and run.leader is None:
            # The pending plan's checkpoint may have just turned suspect: decided again,
            # by the sidecar that decides the run's actions (a node sidecar adopts them).
            revised = self.alerts.revise(_context(run), now)
            if revised:
                live.lifecycle.withdrawn(pending.action_id)
                result.actions.extend(revised)
                self.acted(run.run_id, revised, now)
        if isinstance(record, AgreementRecord) and not quiet and run.leader is None:
            self._plan_refused(live, record, now, result)
        if run.verdict.observe(record, findings):
            self._store_verdict(run)
        if findings and quiet:
            run.count_findings(findings)
        elif findings:
            self._route(run, findings, now, result, origin)
        if not quiet:
            self._retry(run, now, result)

    def _plan_refused(self, live: LiveRun, record: AgreementRecord, now: float,
                 result: IngestResult) -> None:
        """The job refused its pending rollback (``unreported``: the plan names a
        checkpoint no process of the job saved, so no rank loads it, and the client stops
        the run): withdrawn for a stop, so the run's page and phase say it stopped rather
        than wait for a relaunch (alerting/episodes.py ``refused``)."""
        pending = live.lifecycle.rollback
        if (record.outcome != "unreported" or record.action != "rollback" or pending is None
                or pending.action_id != record.action_id):
            return
        taken = self.alerts.refused(_context(live.state), record.action_id, now)
        if taken:
            live.lifecycle.withdrawn(record.action_id)
            result.actions.extend(taken)
            self.acted(live.run_id, taken, now)

    def _rival(self, live: LiveRun, record: Record, attempt: int, now: float,
               result: IngestResult, origin: int | None) -> bool:
        """Judge a record of a replaced attempt that comes from a job still running, and
        say whether it did (detectors/two_jobs.py states the rule): its ``time`` is after
        the attempt that replaced it began (a spool delivered late holds records from
        before its process ended). The first pages ``two_jobs``; each is judged by a suite
        of the attempt's own and its findings paged as a partial view (no rule acts on
        another job's history). The suites live in memory only, ``MAX_RIVALS`` at most."""
        later = live.attempts.superseded_by(attempt, record.kind, record.step)
        if later is None or record.time is None:
            return False
        began = live.attempts.get(later)
        if record.time <= began.started_at:
            return False
        key, found = (record.run_id, attempt), []
        suite = self._rivals.pop(key, None)
        if suite is None:
            if len(self._rivals) >= MAX_RIVALS:
                self._rivals.pop(next(iter(self._rivals)))
            suite = DetectorSuite(self.settings.detectors)
            if two_jobs.TwoJobsDetector.type not in self.settings.detectors.disabled:
                found.append(two_jobs.finding(record, attempt, later, began.start_step,
                                              began.started_at))
        if not isinstance(record, EndRecord):
            self._rivals[key] = suite  # an ended job's suite goes
        why = (f"attempt {attempt}, a job still running that attempt {later} replaced: "
               "not the run's history")
        try:
            judged = suite.update(record, origin is not None)
        except Exception:  # a detector bug must never cost a stored record
            self.metrics.detector_errors.inc()
            log.exception("detector failed on %s step %s", record.run_id, record.step)
            judged = []
        found += [dataclasses.replace(f, attempt=attempt).seen_partially(why) for f in judged]
        result.late += 1  # history, as the run's reads see it
        if found:
            self._route(live.state, found, now, result, origin)
        return True

    def _retry(self, run: RunState, now: float, result: IngestResult) -> None:
        """A rollback that waited for a rank to report up to the fault's onset (a save
        before it may have been on its way, alerting/rollback.py ``behind``): decided once
        the ranks caught up or the wait is over."""
        if not self.alerts.waiting(run.run_id):
            return
        taken = self.alerts.retry(_context(run), now)
        if taken:
            result.actions.extend(taken)
            self.acted(run.run_id, taken, now)

    def _replay(self, live: LiveRun, after: int, now: float, quiet: bool = False) -> None:
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
        self._applied(live)
        if after or live.attempts.owner > 1:
            self._restore_placement(live, carried_only=not after)
        self._catch_up_goodput(live, after)
        for row in recovery.stored_tail(self.store, live.run_id, after):
            self._process(live, row.record, row.row_id, now, result, arrival=arrival,
                          attempt=row.attempt, quiet=quiet, body=row.body, origin=row.origin)
            replayed += 1
            if quiet:  # effects durable already: snapshots as it goes (registry.rebuild)
                self.registry.snapshot_advanced(live, now)
        self.replayed += replayed
        if result.findings:
            self.store.insert_findings([f.to_dict() for f in result.findings])
        self._queue(result)
        if not quiet:
            self._reconcile(live, now)
        # A rollback rebuilt the verdict from what is left of the history: the row says so
        # too, the moment it happens or, after a kill -9 in between, on the next load.
        self._store_verdict(live.state)
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

    def _reconcile(self, live: LiveRun, now: float) -> None:
        """Make the two databases agree after a crash between their commits
        (pipeline/failpoints.py). The record store settles a new attempt before alerting
        hears of it: an attempt settled here whose news never reached alerting is told
        again, as it would have been live. The rollback still pending there is applied if
        the attempt started after it was decided, at or before its window. The goodput
        ledger settles every attempt it has not settled yet."""
        lifecycle, run = live.lifecycle, live.state
        pending = lifecycle.rollback
        decided = None if pending is None else next(
            (a.created_at for a in lifecycle.open_actions() if a.id == pending.action_id),
            None)
        for attempt in live.attempts.attempts:
            if attempt.kind not in ("resumed", "restarted") or attempt.start_step is None:
                continue
            applies = (pending is not None and decided is not None
                       and attempt.start_step <= pending.skip_from
                       and attempt.started_at >= decided)
            if applies:
                log.warning("run %s: attempt %d resumed at step %d applied rollback %d "
                            "before a crash; alerting is told now", run.run_id,
                            attempt.number, attempt.start_step,
                            pending.action_id if pending is not None else 0)
                self._lifecycle(live, lifecycle.settled(attempt), now)
                pending = None
            elif attempt.number not in run.goodput.settled_attempts:
                _settle_goodput(run, attempt,
                                attempt.start_step in lifecycle.applied_starts)

    def _apply(self, live: LiveRun, record: Record, arrival: float,
               origin: int | None = None, attempt: int = 1) -> None:
        run = live.state
        if origin is not None:
            run.rank(record.rank).remote = True
        if isinstance(record, StepRecord):
            run.apply_step(record, arrival, metric_names.STEP_DURATION_BUCKETS)
            if live.lifecycle.silent is not None:  # it was only quiet
                live.lifecycle.heard()
                self._lifecycle(live, [], arrival)
        elif isinstance(record, EvalRecord):
            run.apply_eval(record, arrival)
        elif isinstance(record, RunRecord):
            run.apply_run(record, remote=origin is not None)
            if origin is None:
                self._place(live, record, attempt)
                self._retire(live)
            else:
                self._expect_forwarded(live, record, attempt)
        elif isinstance(record, EndRecord) and _ends_run(live, record, attempt) \
                and not self._cut_off(live, record, attempt):
            run.apply_end(record.status, arrival)
            self.store.set_status(run.run_id, record.status, record.time)
            self._lifecycle(live, live.lifecycle.ended(record.status, record.step), arrival)

    def _cut_off(self, live: LiveRun, record: EndRecord, attempt: int) -> bool:
        """A worker its launcher stopped while another rank of its attempt did not end so
        (runs/attempt_end.py ``cut_off``): the run goes on to its relaunch or its silence."""
        if record.status != "stopped":
            return False
        ranks = {r for n, r in live.attempts.stepped if n == attempt}
        return attempt_end.cut_off(record.rank, record.status, record.error, ranks,
                                   self.store.rank_ends(live.run_id, attempt))

    def _checkpoint(self, run: RunState, record: CheckpointRecord, attempt: int) -> None:
        """Keep a checkpoint in the run's ledger (stored, so a restart keeps it), with the
        data position its state resumes from: the record's own, else that of its rank's
        step record of the same step (sent just before it, on the same queue)."""
        position = record.data_position
        rank = run.ranks.get(record.rank)
        if position is None and rank is not None and rank.data_step == record.step:
            position = rank.data_position
        stored = self.store.add_checkpoint(StoredCheckpoint(
            run.run_id, record.step, attempt, record.rank, record.path, record.time,
            record.bytes, record.tag, record.attempt, position))
        run.ledger.add(LedgerEntry(stored.step, stored.path, stored.rank, stored.time,
                                   stored.attempt, stored.bytes, stored.tag, stored.token,
                                   stored.position))
        run.version += 1

    def _store_verdict(self, run: RunState) -> Verdict:
        """Put the run's verdict on its row when it changed (a cause, a NaN stretch, the
        end): what the API shows once the run has left memory."""
        verdict = run.judged()
        text = verdict.to_json()
        if text != run.stored_verdict:
            self.store.set_verdict(run.run_id, text)
            run.stored_verdict = text
            run.verdict_label = verdict.label
            run.version += 1
        return verdict

    def _cap_layers(self, run: RunState, record: StepRecord) -> StepRecord:
        record, dropped = cap_layers(record, run.layer_names,
                                     self.settings.max_layer_names_per_run)
        if dropped:
            self.metrics.dropped_series.labels(reason="max_layer_names").inc(dropped)
        return record

    def _detect(self, live: LiveRun, record: Record, remote: bool = False) -> list[Finding]:
        t0 = time.perf_counter()
        try:
            findings = live.suite.update(record, remote)
        except Exception:  # a detector bug must never cost a stored record
            self.metrics.detector_errors.inc()
            log.exception("detector failed on %s step %s", record.run_id, record.step)
            findings = []
        self.metrics.detector_duration.observe(time.perf_counter() - t0)
        if isinstance(record, StepRecord):
            live.state.rank(record.rank).loss_ema = live.suite.ema_loss(record.rank)
        return findings

    def _handle_findings(
        self, run: RunState, findings: list[Finding], now: float, result: IngestResult,
        told: bool = False, closed: bool = False,
    ) -> None:
        """Page (and let rules act on) findings judged here; ``told``: paged already, by
        a node sidecar while this one, the run's leader, was away (recorded, not paged)."""
        partial = self._partial(run, now)
        if partial is not None:
            findings = [f.seen_partially(f"the run's view is partial: {partial}")
                        for f in findings]
        findings = _name_nodes(run, findings)
        run.count_findings(findings)
        result.findings.extend(findings)
        context = _context(run)
        taken = (self.alerts.handle(context, findings, now, told=True, closed=closed) if told
                 else self.alerts.handle(context, findings, now))
        result.actions.extend(taken)
        if taken:
            self.acted(run.run_id, taken, now)

    # -- the run's lifecycle (runs/lifecycle.py) -------------------------------------------

    def _open_actions(self, run_ids: set[str], result: IngestResult) -> None:
        """Every ingest answer carries its runs' open actions (the client keeps each once):
        a plan decided on another rank's finding, or by the leader on another node's,
        reaches this rank with its next answer, not its next poll."""
        given = {a.id for a in result.actions}
        for run_id in run_ids:
            live = self.registry.get(run_id)
            if live is None:
                continue
            for action in live.lifecycle.open_actions():
                if action.id not in given:
                    result.actions.append(action)

    def run_bounds(self, run_id: str) -> RunBounds | None:
        """The run as this sidecar knows it, for checking the actions a leader decided for
        it (alerting/plan_check.py); None when it is not in memory."""
        live = self.registry.get(run_id)
        if live is None or not live.state.ranks:
            return None
        ranks = live.state.ranks.values()
        positions = [r.data_position for r in ranks if r.data_position is not None]
        return RunBounds(latest_step=max(r.last_step for r in ranks),
                         latest_position=max(positions) if positions else None,
                         per_step=max((r.per_step for r in ranks), default=1))

    def acted(self, run_id: str, actions: list[Action], now: float) -> None:
        """Actions decided for a run, here or (on a node sidecar) adopted from its leader."""
        live = self.registry.get(run_id)
        if live is not None:
            self._lifecycle(live, live.lifecycle.acted(actions), now)
        self._drain(live, run_id, actions)

    def _retire(self, live: LiveRun) -> None:
        """Forget the ranks past the job's world size: a relaunch re-formed it with fewer
        (a node left out), and their kept history must not make them hung or awaited."""
        world = _world(live.state)
        gone = {r for r in live.state.ranks if r >= world}
        if gone and world < len(live.state.ranks):
            live.state.retire(gone)
            live.suite.retire(gone)

    def _drain(self, live: LiveRun | None, run_id: str, actions: list[Action]) -> None:
        """Drain this node when a restart leaves it out (cluster/drain.py): a node the plan
        names by this sidecar's id, or (``leads``: the run is judged here) by none, the
        leader's own node."""
        if self.node_drain is None:
            return
        leads = live is not None and live.state.leader is None
        local = {r for r, s in live.state.ranks.items() if not s.remote} if live else set()
        for action in actions:
            if action.action not in RESTART_ACTIONS or action.honoured_step is not None:
                continue
            plan = action.restart
            for node in plan.exclude if plan is not None else ():
                # Named by no sidecar: the leader's own node, if its own ranks run there
                # (a leader that only relays other nodes' ranks drains nothing of its own).
                own = leads and bool(local) and (not node.ranks or bool(set(node.ranks) & local))
                if (node.sidecar == self.identity) if node.sidecar else own:
                    self.node_drain.drain(run_id, action.id, node.why)
                    if live is not None and not leads:
                        live.state.left_out = live.state.attempt

    def _lifecycle(self, live: LiveRun, events: list[Event], now: float) -> None:
        """Hand each of a run's lifecycle events to whatever consumes it."""
        run = live.state
        for event in events:
            if isinstance(event, AttemptSettled) and event.attempt.kind != "first":
                # The ledger first: the pages closed below say what the restart cost.
                _settle_goodput(run, event.attempt,
                                any(isinstance(e, RolledBack) for e in events))
                # Alerting applies a rollback this attempt resumed at, closes the alerts
                # about what it abandoned, and may decide again (alerting/rollback.py).
                self.alerts.attempt_settled(run.run_id, event.attempt.start_step or 0, now,
                                            event.attempt.started_at)
                self._applied(live)  # a restart forgets earlier windows
                run.roster.reformed(now)
                run.left_out = None
                self._retire(live)
            elif isinstance(event, RolledBack):
                self._applied(live)
                self._store_verdict(run)  # the attempt is a rollback, not a crash's resume
            elif isinstance(event, Ended):
                verdict = self._store_verdict(run)
                self.alerts.run_ended(run.run_id, event.status, now, event.step,
                                      verdict=verdict.words)
                leader = self._following(run)
                if (leader is not None and event.status == "completed"
                        and self.links.lost(leader, now)):
                    # Its partial-view pages just resolved here, saying so: the leader,
                    # catching up, keeps them to itself (no second resolve).
                    self.store.uplink.mark_closed(leader, run.run_id)
        phase = live.lifecycle.describe()
        if phase != run.phase:
            run.phase, run.phase_state = phase, live.lifecycle.phase.value
            run.version += 1

    def _applied(self, live: LiveRun) -> None:
        """The run's newest applied rollback, where its consumers read it: the windows a
        later plan skips too (``RunState.skipped``), the windows the resumed run's data is
        checked against (detectors/window_trained.py), and the verdict's account of every
        resumed attempt (a rollback, or a resume after a crash)."""
        run, applied = live.state, live.lifecycle.applied
        run.skipped = applied.skip if applied is not None else ()
        run.skipped_unit = applied.unit if applied is not None else "positions"
        live.suite.ctx.skip_plan = None if applied is None else SkipPlan(
            applied.action_id, applied.skip, applied.resume_position, applied.start_step,
            applied.unit)
        run.verdict.rollbacks = self.registry.rollbacks(live)

    # -- one run, one brain (monitor_agent/cluster) ----------------------------------------

    def _place(self, live: LiveRun, record: RunRecord, attempt: int) -> None:
        """Whether this sidecar judges the run or forwards it to the run's leader, and how
        many nodes a leader waits for: set by the first run record of this sidecar's own
        ranks in the attempt that owns the run's history, changed only when a later
        attempt settles (a relaunch, whose placement may differ: ``RunRegistry.rebuild``
        replays its run record). A run record of another attempt, a second one of the same
        attempt (another rank, or any process that joined it), or a node sidecar's
        forwarded one never moves it (docs/format.md, "Who may write what")."""
        run = live.state
        if attempt != live.attempts.owner or (run.placed_by == attempt
                                              and not _leads_from_afar(run)):
            return
        try:
            leader = leader_of(record.cluster, self.settings.cluster, self.settings.port)
        except ValueError as exc:
            log.warning("run %s: %s; judging its ranks here alone", run.run_id, exc)
            leader = None
        cluster = record.cluster
        run.roster = Roster()
        if cluster is not None:
            run.roster.expect(cluster.nodes, cluster.local_world_size)
            run.roster.local = {cluster.node_rank}
        run.leader, run.node = leader, cluster.node_rank if cluster is not None else None
        run.placed_by = attempt
        run.version += 1

    def _keep_leading(self, live: LiveRun, record: RunRecord) -> None:
        """A run this sidecar led in an earlier attempt (``record``: the run record of its
        own ranks that placed it there, as node 0, following no one) and none of whose
        ranks report here in the attempt that owns the run now: the job re-formed without
        this machine (a restart left it out; torchrun renumbered the others from 0). The
        run stays here, one run with one brain, for node sidecars whose
        ``cluster.leader_url`` names this one (cluster/placement.py): this sidecar leads it
        with no node of its own (``roster.local`` empty), admits every node of the new
        job, node 0 included, and expects as many as the first run record they forward of
        the new attempt says (``_expect_forwarded``). Leadership itself is never a
        forwarded record's word: only this sidecar's own ranks' records place it."""
        run, cluster = live.state, record.cluster
        if cluster is None or cluster.nodes <= 1 or cluster.node_rank != 0:
            return
        try:
            if leader_of(cluster, self.settings.cluster, self.settings.port) is not None:
                return
        except ValueError:
            return
        run.roster = Roster(local=set())
        run.roster.expect(cluster.nodes, cluster.local_world_size)
        run.leader, run.node = None, None
        run.placed_by = live.attempts.owner
        run.version += 1
        # Restored from a snapshot, the forwarded run records of the attempt may not be
        # replayed: the first rank that stepped in it says how many nodes it has.
        owner = live.attempts.owner
        stepped = sorted(r for a, r in self.store.attempt_ranks(live.run_id) if a == owner)
        for rank in stepped[:1]:
            body = self.store.last_record(live.run_id, rank, "run")
            for forwarded in _run_records([body] if body is not None else []):
                self._expect_forwarded(live, forwarded, owner)

    def _expect_forwarded(self, live: LiveRun, record: RunRecord, attempt: int) -> None:
        """How many nodes a run led from afar (``_keep_leading``) has in its attempt: what
        the first run record a node sidecar forwards of that attempt says (its ranks are
        all forwarded; this sidecar has no run record of its own to read it from)."""
        run, cluster = live.state, record.cluster
        if (cluster is None or not _leads_from_afar(run) or attempt != live.attempts.owner
                or run.roster.attempt == attempt):
            return
        run.roster.expected = max(cluster.nodes, 1)
        if cluster.local_world_size is not None:
            run.roster.local_world_size = cluster.local_world_size
        run.roster.attempt = attempt
        run.version += 1

    def _restore_placement(self, live: LiveRun, carried_only: bool = False) -> None:
        """Where a run restored from its snapshot sits. The tail replayed after the
        snapshot may no longer hold the run record that placed it, so the first one of
        this sidecar's own ranks in the attempt that owns the run is read back (and the
        run's description, from the latest run record of that attempt). A run whose owner
        attempt has no run record of this sidecar's own ranks may be one it leads from afar
        (``_keep_leading``); ``carried_only``: only that is read back (the whole history
        is replayed after, placing the rest)."""
        owner = live.attempts.owner
        ranks = set(live.state.ranks)
        if carried_only:  # nothing restored yet: the ranks the store knows of
            ranks.update(rank for _, rank in self.store.attempt_ranks(live.run_id))
        attempt, found = self.store.placing_records(live.run_id, sorted(ranks), owner)
        if attempt < owner:
            # The owner attempt's settle superseded the earlier attempts' run records: the
            # one that placed the run here before is read from the replaced history.
            led, before = self.store.placing_records(live.run_id, sorted(ranks), owner,
                                                     replaced=True)
            first = _run_records(before)[:1]
            if first and led < owner and live.state.placed_by is None:
                self._keep_leading(live, first[0])
            if carried_only or _leads_from_afar(live.state):
                return
        elif carried_only:
            return
        for record in _run_records(found):
            live.state.apply_run(record)
            self._place(live, record, owner)

    def _leads(self, run: RunState) -> bool:
        """Whether this sidecar is the leader of a multi-node run (its ranks are node 0's,
        or it led the run before the job re-formed without its machine)."""
        return (self.settings.cluster.enabled and run.leader is None
                and (run.node == 0 or _leads_from_afar(run)) and run.roster.expected > 1)

    def _following(self, run: RunState) -> str | None:
        """The leader this sidecar forwards the run to, or None when it judges it here."""
        leader = run.leader
        return None if leader is None or self.links.is_self(leader) else leader

    def _forward(self, run: RunState, record: Record, body: bytes | None,
                 result: IngestResult, quiet: bool, origin: int | None) -> None:
        """Queue the digest of a record of this sidecar's own ranks for the run's leader."""
        leader = self._following(run) if origin is None and not quiet else None
        if leader is None or body is None:
            return
        flags = DROPPABLE if isinstance(record, StepRecord) else \
            VITAL if isinstance(record, RunRecord | CheckpointRecord | EndRecord) else 0
        result.uplink.append(UplinkRow(leader, run.run_id, "record",
                                       digest(record.kind, body), flags))

    def _route(self, run: RunState, findings: list[Finding], now: float,
               result: IngestResult, origin: int | None = None) -> None:
        """Findings of a followed run go to its leader, which pages for the whole run; only
        while the leader is away are they paged here, marked as a partial view (and
        forwarded still, so the leader records them without paging them twice)."""
        leader = self._following(run) if origin is None else None
        if leader is None:
            self._handle_findings(run, findings, now, result)
            return
        lost = self.links.lost(leader, now)
        for f in findings:
            flags = (LOCAL_VIEW if f.type in RUN_SCOPED_TYPES else 0) | (PAGED if lost else 0)
            result.uplink.append(UplinkRow(leader, run.run_id, "finding",
                                           wire.dumps(f.to_dict()), flags))
        if lost:
            why = self.links.why(leader, now)
            self._handle_findings(run, [f.seen_partially(why) for f in findings], now, result)
        else:
            run.count_findings(findings)
            result.findings.extend(findings)

    def _partial(self, run: RunState, now: float) -> str | None:
        """Why the leader's view of a running multi-node run is partial, or None."""
        if run.roster.expected <= 1 or run.status != "running":
            return None
        return run.roster.partial(now, self.settings.cluster.peer_timeout_seconds,
                                  run.first_seen)

    def ingest_peer(self, batch: PeerBatch, now: float) -> IngestResult:
        """A node sidecar's exchange with this one, the leader of its runs: its digests go
        through ``ingest`` (the same checks as a client's records; judged by the
        cross-rank detectors only), its findings are paged here for the whole run, and its
        heartbeat keeps its node in the runs' view. Only runs this sidecar leads, from a
        node of the run's placement (``_peer_refusal``), are taken: the rest of the
        exchange is left with the node sidecar (``deferred``) to send again.

        Findings the node paged itself while this leader was away go first: they are about
        what the digests behind them say, so this leader's own judgement of those digests
        joins the alert they began instead of paging it again.

        Raises as ``ingest`` does; a finding's effects are committed before the answer."""
        deferred: dict[str, str] = {}
        nodes: dict[str, int] = {}
        for peer in batch.runs:
            peer = self._known_node(peer, batch.sidecar)
            why = self._peer_refusal(peer, now)
            if why is not None:
                deferred[peer.run_id] = why
            nodes[peer.run_id] = peer.node
        for run_id, why in self._relaunched_here(batch).items():
            deferred.setdefault(run_id, why)
        items, refused = [], []
        for item in batch.items:
            if item.record.run_id in deferred:
                continue
            item = dataclasses.replace(item, origin=nodes[item.record.run_id])
            live = self.registry.get(item.record.run_id)
            rank = live.state.ranks.get(item.record.rank) if live is not None else None
            if (rank is not None and live is not None and not rank.remote
                    and not _leads_from_afar(live.state)):
                refused.append({"index": item.index, "reason": (
                    f"rank: rank {item.record.rank} of run {item.record.run_id} reports to "
                    "this sidecar itself: a node sidecar forwards only its own ranks")})
                continue
            items.append(item)
        carried = {(item.record.run_id, item.record.rank) for item in items}
        findings, refused_findings = [], []
        for index, (f, flags) in enumerate(batch.findings):
            if f.run_id in deferred:
                continue
            why = self._peer_finding_refusal(f, nodes[f.run_id], batch.forwarder, carried)
            if why is None:
                findings.append((f, flags))
            else:
                refused_findings.append({"index": index, "reason": why})
        told = [(f, flags) for f, flags in findings if flags & PAGED]
        found = self._peer_findings(told, now)
        result = self.ingest(items, now) if items else IngestResult()
        result.rejected.extend(refused)
        result.rejected_findings.extend(refused_findings)
        taken = {r["index"] for r in result.rejected}
        for item in items:
            if item.index not in taken:
                live = self.registry.get(item.record.run_id)
                if live is not None:
                    live.state.rank(item.record.rank).via = batch.forwarder
        for peer in batch.runs:
            live = self.registry.get(peer.run_id)
            if live is not None and peer.run_id not in deferred:
                live.state.roster.heard(nodes[peer.run_id], batch.sidecar, peer.host,
                                        list(peer.ranks), now)
        later = self._peer_findings([(f, flags) for f, flags in findings
                                     if not flags & PAGED], now)
        result.actions.extend(found.actions + later.actions)
        result.deferred, result.taken = deferred, len(findings)
        return result

    def _relaunched_here(self, batch: PeerBatch) -> dict[str, str]:
        """Runs whose exchange waits (``deferred``): a record of one of this sidecar's own
        ranks under a token the run has not placed, a new process of that rank number on
        another machine (a re-formed job renumbered the ranks, and this sidecar has not
        settled the new attempt from the others' records yet). Refused outright it would
        be lost; once the run leads from afar (``_keep_leading``) it is taken. What a
        node sidecar may say of this sidecar's own ranks is unchanged: nothing."""
        out: dict[str, str] = {}
        for item in batch.items:
            record = item.record
            live = self.registry.get(record.run_id)
            rank = live.state.ranks.get(record.rank) if live is not None else None
            if (live is None or rank is None or rank.remote or _leads_from_afar(live.state)
                    or (record.attempt or "") in live.attempts.tokens):
                continue
            out.setdefault(record.run_id, (
                f"run {record.run_id}: rank {record.rank} reports to this sidecar itself; "
                "a new process of it elsewhere waits for the run's next attempt here"))
        return out

    def _peer_finding_refusal(self, finding: Finding, node: int, forwarder: str,
                              carried: set[tuple[str, int]]) -> str | None:
        """Why a node sidecar's finding may not be taken here, or None. A finding acts on
        the run (its rules may roll back, stop, restart), so it is taken only about a
        rank whose records that very node sidecar forwards: a rank it forwarded before
        (``RankState.via``: its id at the address it connects from), or one whose records
        ride this exchange and pass the checks of ``/v1/records`` with it. A caller that
        holds the link's credential but not the rank's records (the credential is derived
        from the write token unless ``cluster.peer_token`` is set) cannot make the leader
        act on another node's rank, nor on this sidecar's own."""
        live = self.registry.get(finding.run_id)
        rank = live.state.ranks.get(finding.rank) if live is not None else None
        where = f"rank {finding.rank} of run {finding.run_id}"
        if rank is not None and not rank.remote and not (
                live is not None and _leads_from_afar(live.state)):
            return f"rank: {where} reports to this sidecar itself, not through node {node}"
        if rank is not None and rank.via is not None and rank.via != forwarder:
            return (f"rank: {where} is forwarded by another node sidecar ({rank.via}); a "
                    "finding is taken only from the sidecar that forwards the rank's records")
        if (rank is None or rank.via is None) and (finding.run_id, finding.rank) not in carried:
            return (f"rank: no record of {where} reached this leader from node {node}; a "
                    "finding is taken only about a rank whose records its sidecar forwards")
        return None

    def _known_node(self, peer: PeerRun, sidecar: str) -> PeerRun:
        """A run a node sidecar owes items of but no longer holds in memory comes as node
        -1: the node that sidecar was heard as for the run, if this leader heard it."""
        live = self.registry.get(peer.run_id)
        if peer.node >= 0 or live is None:
            return peer
        node = next((n for n, seen in live.state.roster.nodes.items()
                     if seen.sidecar == sidecar), -1)
        return dataclasses.replace(peer, node=node)

    def _peer_refusal(self, peer: PeerRun, now: float) -> str | None:
        """Why a node sidecar's items of ``peer``'s run are not taken here (now), or None:
        this sidecar does not lead the run (its own node 0 ranks have not placed it here,
        or placed it elsewhere), or the node is not one of the run's placement."""
        live = self.registry.get(peer.run_id)
        if live is None and self.store.run_row(peer.run_id) is not None:
            live = self.registry.admit(peer.run_id, now)
        if live is None:
            return (f"run {peer.run_id}: no rank of it reported to this sidecar (the leader "
                    "is node 0's sidecar, placed by node 0's ranks)")
        run = live.state
        if not self._leads(run):
            return f"run {peer.run_id}: this sidecar does not lead it (its ranks here " + (
                f"are node {run.node}'s)" if run.node is not None else "name no node)")
        first = 0 if _leads_from_afar(run) else 1
        if not first <= peer.node < run.roster.expected:
            return (f"run {peer.run_id}: node {peer.node} is not a node of its placement "
                    f"(nodes {first}..{run.roster.expected - 1} follow this leader)")
        return None

    def _peer_findings(self, items: list[tuple[Finding, int]], now: float) -> IngestResult:
        by_run: dict[str, list[tuple[Finding, int]]] = {}
        for finding, flags in items:
            by_run.setdefault(finding.run_id, []).append((finding, flags))
        found = IngestResult()
        try:
            for run_id, found_here in by_run.items():
                live = self.registry.get(run_id)  # led here: ingest_peer loaded it
                if live is not None:
                    self._remote_findings(live, found_here, now, found)
            if found.findings:
                self.store.insert_findings([f.to_dict() for f in found.findings])
        except Exception as exc:
            for run_id in by_run:
                self.registry.evict(run_id)
            if isinstance(exc, StorageError):
                raise StorageError(f"a node sidecar's findings not stored: {exc}") from exc
            raise
        return found

    def _remote_findings(self, live: LiveRun, items: list[tuple[Finding, int]], now: float,
                         result: IngestResult) -> None:
        """A node sidecar's findings about its own ranks: the run's, counted once here.
        A cross-rank one made from that node's view alone is left out (this sidecar
        judges those from every node's digests) unless the node paged it while this one
        was away: then it is recorded as told, so the same fault is not paged twice."""
        run = live.state
        attempt = max(live.attempts.current, 1)
        fresh: list[Finding] = []
        told: list[Finding] = []
        closed: list[Finding] = []
        for finding, flags in items:
            if flags & LOCAL_VIEW and not flags & PAGED:
                continue
            f = dataclasses.replace(finding, attempt=attempt)
            if run.ledger.observe(f):
                run.version += 1
            (closed if flags & CLOSED else told if flags & PAGED else fresh).append(f)
        if run.verdict.observe(None, fresh + told + closed):
            self._store_verdict(run)
        if told:
            self._handle_findings(run, told, now, result, told=True)
        if closed:
            self._handle_findings(run, closed, now, result, told=True, closed=True)
        if fresh:
            self._handle_findings(run, fresh, now, result)

    def followed(self) -> list[tuple[str, PeerRun]]:
        """(leader, run) for every run in memory this sidecar forwards to a leader: what
        its heartbeat names (cluster/link.py asks, on the engine thread)."""
        out = []
        for live in self.registry:
            run = live.state
            leader = self._following(run)
            if leader is not None and run.node is not None and run.left_out is None:
                host = host_label(run.run.labels) if run.run is not None else None
                out.append((leader, PeerRun(run.run_id, run.node, host,
                                            tuple(sorted(run.ranks)))))
        return out

    def page_stranded(self, leader: str, now: float, why: str | None,
                      run_id: str | None = None) -> int:
        """Page here what is owed to ``leader`` (of ``run_id``, or every run) and nobody
        paged: it has been away too long, or will not take the run (``why``, said in each
        page as a partial view), or it turned out to be this very sidecar (``why`` None:
        the run was never followed). Returns how many."""
        queued = self.store.uplink.stranded(leader, run_id)
        paged = self._page_owed(queued, now, why)
        self.store.uplink.mark_paged([q.id for q in queued])
        return paged

    def _page_owed(self, queued: Sequence[UplinkItem], now: float, why: str | None) -> int:
        by_run: dict[str, list[Finding]] = {}
        for q in queued:
            try:
                by_run.setdefault(q.run_id, []).append(Finding.from_dict(wire.loads(q.body)))
            except (KeyError, TypeError, ValueError):
                continue
        result = IngestResult()
        for run_id, findings in by_run.items():
            if why is not None:
                findings = [f.seen_partially(why) for f in findings]
            live = self.registry.get(run_id)
            context = _context(live.state) if live is not None else RunContext(run_id)
            result.actions.extend(self.alerts.handle(context, findings, now))
        return sum(len(f) for f in by_run.values())

    def _finish(self, result: IngestResult) -> None:
        if result.findings:
            self.store.insert_findings([f.to_dict() for f in result.findings])
        self._queue(result)

    def _queue(self, result: IngestResult) -> None:
        """What this sidecar owes the run leaders it follows: stored, then sent."""
        if result.uplink:
            queue, cluster = self.store.uplink, self.settings.cluster
            queue.put(result.uplink, time.time())
            dropped, unheard = queue.trim(cluster.uplink_max_rows, cluster.uplink_max_bytes)
            if dropped:
                self.metrics.uplink_dropped.inc(dropped)
                # Dropped before any leader had them, and paged by nobody: paged here.
                self._page_owed(unheard, time.time(), "the queue for the run's leader was "
                                "over its bound (cluster.uplink_max_rows/_bytes)")
            self.metrics.uplink_queued.set(queue.rows)
            self.links.queued()
        m = self.metrics.records
        m.labels(outcome="accepted").inc(result.accepted)
        m.labels(outcome="duplicate").inc(result.duplicates)
        m.labels(outcome="late").inc(result.late)

    # -- clock-driven work ----------------------------------------------------------------

    def recover(self, now: float) -> int:
        """Reload the runs that were active before a restart; return how many."""
        return self.registry.recover(now)

    def tick(self, now: float) -> list[Finding]:
        """Stall checks, alert resolves, expiry, snapshots and retention; call every second."""
        self.registry.reload_evicted(now)
        findings: list[Finding] = []
        for live in self.registry:
            self._goodput_view(live.state, now)
            findings.extend(self._tick_run(live, now))
        if findings:
            self.store.insert_findings([f.to_dict() for f in findings])
        self._queue(self._ticked)
        self._ticked = IngestResult()
        self.alerts.tick(now)
        self.registry.expire(now)
        if now - self._last_snapshot >= self.settings.snapshot_interval_seconds:
            self.registry.snapshot_all(now)
            self._last_snapshot = now
        self.retention.prune_some(self.registry.states())
        self._count_runs()
        self.metrics.ticks.inc()
        return findings

    def _incident_cost(self, run_id: str, kind: str, step: int, rolled_back: bool
                       ) -> str | None:
        """What the incident a resolving alert was about cost its run (runs/goodput.py):
        a hang (``hang``, ``stalled``), the straggler tax so far, or the rollback or
        restart that closed an alert about the steps it abandoned. None for the rest."""
        live = self.registry.get(run_id)
        if live is None:
            return None
        book = live.state.goodput
        if rolled_back:
            inc = book.last_incident("rollback", "restart")
            if inc is None:
                return None
            if inc.kind == "restart":  # a relaunch: the failure it ended, start to end
                report = book.report()
                found = ettr_of({"incidents": report.incidents}, None).recoveries
                if found and found[-1].start <= inc.start:
                    return recovery_words(found[-1], book.gpus, book.device)
            return inc.words(book.gpus, book.device) + " so far"
        if kind in ("hang", "stalled"):
            inc = book.last_incident("hang")
            if inc is None or inc.step < step - 1:
                return None
            return inc.words(book.gpus, book.device)
        if kind == "straggler":
            bad = book.report().badput
            tax = sum(bad[cause] for cause in STRAGGLER_CAUSES)
            return (f"the straggler tax so far: {cost_words(tax, book.gpus, book.device)}"
                    if tax > 0 else None)
        return None

    def _goodput_view(self, run: RunState, now: float) -> None:
        """Report the run's goodput ledger where /metrics reads it, when it moved (or a
        hang is open: its cost grows with the clock, the run's own)."""
        book = run.goodput
        view = run.goodput_view
        if view is not None and book.hang is None and view.rows_seen == book.last_row:
            return
        run.goodput_view = book.report(run.clock(now))
        run.version += 1

    def _tick_run(self, live: LiveRun, now: float) -> list[Finding]:
        run = live.state
        self._retry(run, now, self._ticked)  # a wait that ran out with nothing arriving
        if run.status != "running" or not run.ranks:
            return []
        if run.left_out is not None:
            # Its leader left this node out of the run: the silence of its ranks is that
            # decision carried out, not a fault to page (the leader judges the run).
            return []
        record_now = run.clock(now)
        if record_now is None:
            return []
        if run.roster.expected > 1:  # the leader's: silent because unheard, not gone
            live.suite.ctx.unreachable = run.roster.unreachable(
                now, self.settings.cluster.peer_timeout_seconds, run.first_seen)
        try:
            found = live.suite.tick(record_now)
        except Exception:
            self.metrics.detector_errors.inc()
            log.exception("detector tick failed for %s", run.run_id)
            return []
        silence = _silence(found, now - run.last_arrival)
        if silence is not None:
            self._lifecycle(live, live.lifecycle.went_silent(run.last_step, *silence), now)
        if found:
            found = [dataclasses.replace(f, attempt=max(live.attempts.current, 1))
                     for f in found]
            result = IngestResult()
            self._route(run, found, now, result)
            self._ticked.uplink.extend(result.uplink)
            return result.findings
        return found

    def _count_runs(self) -> None:
        counts = {"running": 0, "ended": 0}
        for run in self.registry.states():
            counts["running" if run.status == "running" else "ended"] += 1
        for state, value in counts.items():
            self.metrics.runs.labels(state=state).set(value)


def _ends_run(live: LiveRun, record: EndRecord, attempt: int) -> bool:
    """Whether an end record ends the run: it comes from a rank that trained in its
    attempt, or nobody trained in it (a job that failed before its first step). A process
    that joined without training ends only itself, as one that died before its first step
    does (pipeline/attempts.py)."""
    stepped = live.attempts.stepped
    return (attempt, record.rank) in stepped or not any(n == attempt for n, _ in stepped)


def _step_interval(run: RunState) -> float | None:
    """Seconds of sidecar time per step of the run's busiest rank since it was first heard
    (None before it has a pace): the scale a pause of the run is judged in."""
    best: float | None = None
    for rank in run.ranks.values():
        if rank.first_arrival is None or rank.last_step <= rank.first_step:
            continue
        interval = (rank.last_arrival - rank.first_arrival) / (rank.last_step - rank.first_step)
        best = interval if best is None else min(best, interval)
    return best


def _settle_goodput(run: RunState, attempt: StoredAttempt, rolled_back: bool) -> None:
    """The goodput ledger's account of a new attempt: the work it replaced is rollback
    badput when it applied a plan, else resume (runs/goodput.py ``settled``)."""
    why = ("rollback" if rolled_back else "restart" if attempt.kind == "restarted"
           else "resume")
    run.goodput.settled(attempt.number, attempt.start_step, why)


def _name_nodes(run: RunState, findings: list[Finding]) -> list[Finding]:
    """Each finding folded into the run's node verdicts (runs/node_verdict.py); one that
    names a node not healthy says that node's verdict, so the page it makes does, and a
    rule's ``exclude`` reads whether leaving it out pays (alerting/restart.py)."""
    out = []
    for f in findings:
        named = [v for v in run.observe_nodes([f]) if v.state != "healthy"]
        if named and not f.log_only:
            v = named[0]
            said: dict[str, Any] = {"node_verdict": v.words(), "node_state": v.state,
                                    "node_cause": v.cause}
            if v.price is not None:
                said["node_exclude_pays"] = v.price.exclude_pays
            f = dataclasses.replace(f, message=f"{f.message.rstrip('.')}. Node verdict: "
                                    f"{v.words()}", evidence={**f.evidence, **said})
        note = run.nodes.data_note
        if f.type == "nan_inf" and note is not None and note[0] == f.step and not named:
            f = dataclasses.replace(f, message=f"{f.message.rstrip('.')}. Node verdict: "
                                    f"{note[1]}", evidence={**f.evidence,
                                                            "node_verdict": note[1]})
        out.append(f)
    return out


def _context(run: RunState) -> RunContext:
    config = run.run.config if run.run is not None else {}
    ledger = run.ledger  # views of it, O(1) however many checkpoints (checkpoint_ledger.py)
    return RunContext(
        run_id=run.run_id, project=run.project or None, labels=run.labels, config=config,
        clean_checkpoints=ledger.clean_view(),
        checkpoint_line=ledger.line(),
        checkpoint_positions=ledger.positions_view(),
        data={r: (s.data_step, s.data_position, s.per_step) for r, s in run.ranks.items()
              if s.data_position is not None},
        skipped=run.skipped, skipped_unit=run.skipped_unit,
        skips_by=run.run.skips_by if run.run is not None else None,
        rank_steps={r: s.last_step for r, s in run.ranks.items()},
        checkpoint_ranks=ledger.ranks(),
        first_seen=run.first_seen, source=run.source,
        world=_world(run), nodes=_nodes(run),
        launcher=run.run.launcher if run.run is not None else None,
        attempt=run.attempt, relaunching=run.relaunching,
    )


def _world(run: RunState) -> int:
    """The job's ranks: what its run record says report (else the ranks heard)."""
    hardware = run.run.hardware if run.run is not None else {}
    for key in ("reporting_ranks", "world_size"):
        value = hardware.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return max(len(run.ranks), 1)


def _nodes(run: RunState) -> tuple[NodeView, ...]:
    """The nodes of a multi-node run as its leader hears them (empty: one node): its own,
    whose ranks are those not forwarded by another node, each node the roster heard since
    the job last re-formed, and the others it expects (not heard yet: their ranks by
    ``local_world_size``)."""
    roster = run.roster
    if roster.expected <= 1 or run.leader is not None:
        return ()
    here = run.node if run.node is not None else (None if _leads_from_afar(run) else 0)
    live = set(run.ranks)
    heard = {n: seen for n, seen in roster.nodes.items() if n != here and n < roster.expected}
    remote = {r for seen in heard.values() for r in seen.ranks}
    own = tuple(sorted(r for r, s in run.ranks.items() if not s.remote and r not in remote))
    host = host_label(run.run.labels) if run.run is not None else None
    # Led from afar: every node is another machine's (no view of this sidecar's own).
    views = {} if here is None else {here: NodeView(here, host, None, own)}
    for n in range(roster.expected):
        seen = heard.get(n)
        if seen is not None:
            views[n] = NodeView(n, seen.host, seen.sidecar, tuple(sorted(seen.ranks & live)))
        elif n not in views:
            views[n] = NodeView(n, None, None, tuple(sorted(roster.ranks_of(n) & live)))
    return tuple(views[n] for n in sorted(views))


def _addresses(run: RunState) -> dict[int, str]:
    """Rank -> the address its node is reached at, as this sidecar, the run's leader, hears
    it: a forwarded rank's node sidecar connects from it (``RankState.via``, id@address);
    its own ranks' node is the leader's (their run record's ``cluster.leader_url``: only
    an own rank's record says where the leader is; a forwarded one's may name its own
    node's sidecar). What a collective's error names of its lost peer is matched against
    it (attempt_end.py)."""
    out: dict[int, str] = {}
    record = run.run
    sender = run.ranks.get(record.rank) if record is not None else None
    cluster = record.cluster if record is not None and sender and not sender.remote else None
    own = urlsplit(cluster.leader_url).hostname if cluster and cluster.leader_url else None
    for rank, state in run.ranks.items():
        address = state.via.rpartition("@")[2] if state.via else None
        if not state.remote:
            address = own
        if address and address != "?":
            out[rank] = address
    return out


def _moved(live: LiveRun, record: Record) -> bool:
    """Whether ``record``, of one of this sidecar's own ranks, is a run record placing its
    node elsewhere in the job than the run's placement here says (another node rank, or
    another number of nodes): a re-formed job, whose ranks here may all be new to this
    sidecar (pipeline/attempts.py ``place``). Only on a node sidecar, placed and following
    a leader (which hears every rank and sees the relaunch as such): a process of the same
    launch shares its node's placement, while one sidecar judging alone may hear several
    nodes' ranks."""
    run, cluster = live.state, getattr(record, "cluster", None)
    if not isinstance(record, RunRecord) or cluster is None or run.placed_by is None:
        return False
    if run.leader is None or run.node is None:
        return False
    return cluster.node_rank != run.node or cluster.nodes != run.roster.expected


def _run_records(bodies: list[bytes]) -> list[RunRecord]:
    """The stored run records among ``bodies`` that today's rules still read."""
    out = []
    for body in bodies:
        try:
            record = schemas.parse_record(wire.loads(body))
        except (schemas.RecordError, ValueError):
            continue  # as recovery skips a stored record today's rules reject
        if isinstance(record, RunRecord):
            out.append(record)
    return out


def _leads_from_afar(run: RunState) -> bool:
    """Whether this sidecar leads ``run`` with no node of its own in the job
    (``Engine._keep_leading``): placed, following no one, no node rank, no local node."""
    return (run.placed_by is not None and run.leader is None and run.node is None
            and not run.roster.local)


def _silence(found: list[Finding], silent_for: float) -> tuple[float, bool] | None:
    """(limit, gone) when a tick's findings say the whole run went silent: a ``stalled``
    finding whose limit the run's newest record is older than (every rank is quiet, not
    one), or a ``hang`` finding that judged every reporting rank's process gone."""
    for f in found:
        if f.type == "stalled" and f.threshold is not None and silent_for > f.threshold:
            return float(f.threshold), False
        ranks, gone = f.evidence.get("ranks"), f.evidence.get("gone_ranks")
        if (f.type == "hang" and isinstance(ranks, dict) and gone and len(gone) == len(ranks)
                and not f.evidence.get("hung_ranks")):
            return float(min(_num(v.get("silent_seconds")) for v in ranks.values())), True
    return None


def _num(value: Any) -> float:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def _future_checkpoint(run: RunState, record: CheckpointRecord,
                       seen: dict[tuple[str, int], int]) -> str | None:
    """Why a checkpoint's step cannot be real yet: past the run's latest step from any
    rank (this batch's included) plus ``CHECKPOINT_STEP_SLACK``, or None."""
    latest = max([run.last_step, *(s for (r, _), s in seen.items() if r == record.run_id)])
    if record.step <= latest + CHECKPOINT_STEP_SLACK:
        return None
    return (f"step: checkpoint step {record.step} of run {record.run_id} is in the future: "
            f"the run's latest step from any rank is {latest} (send the checkpoint after "
            f"the step it holds; slack {CHECKPOINT_STEP_SLACK})")


def _checkpoint_clash(live: LiveRun, record: CheckpointRecord, attempt: int,
                      paths: dict[tuple[str, int, int], str]) -> str | None:
    """Why a checkpoint contradicts the ledger (the same step of the same attempt under
    another path), or None; an identical one is a duplicate, not a clash."""
    key = (record.run_id, record.step, attempt)
    known = live.state.ledger.get(record.step, attempt)
    path = known.path if known is not None else paths.get(key)
    if path is None:
        paths[key] = record.path
        return None
    if path == record.path:
        return None
    return (f"path: run {record.run_id} already has a checkpoint at step {record.step} "
            f"(path {path[:200]!r}); a step has one checkpoint per attempt")


def _bare_context(record: Record) -> RunContext:
    return RunContext(run_id=record.run_id)


def attempt_view(run_id: str, attempt: StoredAttempt) -> dict[str, Any]:
    """What the ingest answer says of an attempt (api/ingest.py's ``IngestAttemptOut``)."""
    return {"run_id": run_id, "number": attempt.number, "kind": attempt.kind,
            "start_step": attempt.start_step, "superseded_from": attempt.superseded_from,
            "superseded_to": attempt.superseded_to}


def _row(item: Incoming, attempt: int = 1, superseded_by: int | None = None) -> RecordRow:
    record = item.record
    return RecordRow(
        run_id=record.run_id,
        rank=record.rank,
        kind=record.kind,
        step=record.step,  # a run record's is -1: it sorts before every step
        time=record.time,
        body=item.body,
        attempt=attempt,
        superseded_by=superseded_by,
        origin=item.origin,
    )
