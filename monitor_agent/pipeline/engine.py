"""record -> store -> detectors -> alerting -> run state: the one pipeline, live and offline.

The engine is synchronous and single-threaded by contract: the app calls it from one worker
thread, the trace judge (trace_judge.py) inline with the records' clock. Nothing about
detection exists only in the live path. It is a thin front over stages of one job each:

- per batch: admit (admit.py, attempt_join.py) -> store (keep.py) -> each record's walk
  (walk.py): apply (apply.py) -> detect (detect.py) -> judge (judge.py) -> route
  (routing.py) -> the batch's end (batch_end.py: findings stored, the uplink queued);
- what actions and lifecycle events cause (consequences.py), where a run is judged
  (placement.py), a node sidecar's exchange with its leader (peer_exchange.py), every
  node's TCP figures (link_figures.py), and the clock (clock.py: silence, hang and stall checks, snapshots, retention).

The runs in memory belong to ``registry.RunRegistry`` and the API's questions to
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

from collections.abc import Sequence
from functools import partial

from monitor_agent.alerting.plan_check import RunBounds
from monitor_agent.alerting.sink import AlertSink, NullSink
from monitor_agent.cluster.drain import NodeDrain
from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.cluster.tcp_probe import LinkSample
from monitor_agent.detectors import DetectorSuite
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.admission import AdmissionBudget
from monitor_agent.pipeline.admit import Admission
from monitor_agent.pipeline.apply import StateApply
from monitor_agent.pipeline.attempt_join import AttemptJoin
from monitor_agent.pipeline.batch import (
    Incoming,
    IngestResult,
    PeerBatch,
    PeerRun,
    PreviewResult,
    attempt_view,
)
from monitor_agent.pipeline.batch_end import BatchEnd
from monitor_agent.pipeline.clock import Clock
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.detect import Detection
from monitor_agent.pipeline.failpoints import Failpoints
from monitor_agent.pipeline.incident_cost import incident_cost
from monitor_agent.pipeline.judge import Judge
from monitor_agent.pipeline.keep import keep
from monitor_agent.pipeline.link_figures import LinkFigures
from monitor_agent.pipeline.peer_exchange import PeerExchange
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.pipeline.retention import Retention
from monitor_agent.pipeline.routing import Router
from monitor_agent.pipeline.walk import KeptRecord, RecordWalk
from monitor_agent.records.actions import Action
from monitor_agent.records.types import Finding, StepRecord
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

# The engine's data types, where its callers import them from.
__all__ = ["Engine", "Incoming", "IngestResult", "PeerBatch", "PeerRun", "attempt_view"]


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
        # How each run leader this sidecar forwards to is answering (cluster/link.py
        # writes it; routing a finding reads it).
        self.links = LinkBook(settings.cluster.peer_timeout_seconds)
        self.failpoints = Failpoints(settings.failpoint)
        self.alerts.cost_with(partial(incident_cost, self.registry))
        self._build_stages()

    def _build_stages(self) -> None:
        """The stages, each handed what it uses (lowest first)."""
        s, store, alerts, registry = self.settings, self.store, self.alerts, self.registry
        self.placement = Placement(s, store, self.links)
        self.consequences = Consequences(store, alerts, registry, self.links, self.placement,
                                         s.cluster.end_stopped_ranks)
        self.batch_end = BatchEnd(s, store, self.metrics, alerts, registry, self.links)
        self.router = Router(s, alerts, self.links, self.placement, self.consequences)
        self.walk = RecordWalk(store, alerts, registry, self.placement, self.consequences,
                               StateApply(s, store, self.metrics, self.placement,
                                          self.consequences),
                               Detection(s, self.metrics), Judge(self.consequences),
                               self.router, self.batch_end)
        joins = AttemptJoin(s, store, alerts, registry, self.failpoints, self.placement,
                            self.consequences, self.router, self.batch_end)
        self.admission = Admission(s, self.metrics, alerts, registry, joins)
        self.peers = PeerExchange(store, registry, self.placement, self.router,
                                  self.consequences, self.batch_end, self.ingest)
        self.link_figures = LinkFigures(s.cluster, registry, self.placement)
        self.clock = Clock(s, store, self.metrics, alerts, registry, self.retention,
                           self.router, self.consequences, self.batch_end)

    def _replay(self, live: LiveRun, after: int, now: float, quiet: bool = False) -> None:
        self.walk.replay(live, after, now, quiet)

    # This sidecar's id (cluster/identity.py) and its node's drain (cluster/drain.py), set
    # by the app: a decision that leaves this node out drains it (pipeline/consequences.py).
    @property
    def identity(self) -> str:
        return self.consequences.identity

    @identity.setter
    def identity(self, value: str) -> None:
        self.consequences.identity = value

    @property
    def node_drain(self) -> NodeDrain | None:
        return self.consequences.node_drain

    @node_drain.setter
    def node_drain(self, value: NodeDrain | None) -> None:
        self.consequences.node_drain = value

    @property
    def replayed(self) -> int:
        """Stored records fed again to rebuild runs (the tests count them)."""
        return self.walk.replayed

    # -- records in -----------------------------------------------------------------------

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
        admitted = self.admission.admit(items, result, now, source)
        ids = keep(self.store, self.metrics, admitted)
        if result.resumed:
            self.failpoints.reached("records_stored")
        run_ids = {a.item.record.run_id for a in admitted}
        with self.registry.evicted_on_failure(run_ids, "records stored, their alerts not"):
            for entry, row_id in zip(admitted, ids, strict=True):
                live = self.registry.get(entry.item.record.run_id)
                assert live is not None  # admitted just now, on this thread
                if isinstance(entry.item.record, StepRecord):  # stored: its rank trains here
                    live.attempts.stepped.add((entry.attempt, entry.item.record.rank))
                if row_id is None:
                    result.duplicates += 1
                    continue
                result.accepted += 1
                self.walk.walk(live, KeptRecord.of_admitted(entry, row_id), now, result)
            self.batch_end.finish(result)
            self.consequences.answer_open_actions(run_ids, result)
        for run_id in run_ids:  # their effects are durable
            self.registry.snapshot_advanced(self.registry.get(run_id), now)
        return result

    def preview(self, items: Sequence[Incoming], now: float) -> PreviewResult:
        """Page now about NaN/Inf steps sent ahead of their backlog (``POST
        /v1/records/preview``); return how many alerts that began, and which steps were
        of a run not stored yet.

        Nothing is stored and no detector state changes: the step's in-order copy, when the
        backlog reaches it, is stored and judged like any other and its finding folds into
        the alert begun here (``Alerting.preview``). A stored run not in memory is paged
        about with what the record carries (its id, rank and step) and is not loaded for it;
        such runs count against ``max_new_runs_per_request`` as ingest's do (each costs a
        detector suite and may begin an alert), and the records of runs past it are not
        previewed: their in-order copies page as usual. A run the sidecar never stored
        pages nothing: a preview pages only about runs that ingest admitted (under
        ``max_active_runs``), so made-up run ids cannot fill the outbox ahead of real pages;
        its in-order copy pages as any record does. Such steps are named in
        ``unknown_run``: a client whose run record waits in the same backlog as the NaN
        step (it started while the sidecar was down) sends them again once that record is
        delivered, so the alert begins at the first NaN step, not at a later one previewed
        after the run was stored.
        """
        result = PreviewResult()
        budget = AdmissionBudget(self.settings)
        for item in items:
            record = item.record
            if not isinstance(record, StepRecord):
                continue
            live = self.registry.get(record.run_id)
            if live is None:
                if self.store.run_row(record.run_id) is None:
                    result.unknown_run.append(item.index)
                    continue
                if budget.refuse_run(record.run_id) is not None:
                    continue
                budget.took_run(record.run_id)
            if live is not None and live.state.is_late(record):
                continue  # its in-order copy was judged already
            suite = live.suite if live is not None else DetectorSuite(self.settings.detectors)
            findings = suite.preview(record)
            leader = self.placement.following(live.state) if live is not None else None
            if findings and leader is not None:
                if not self.links.lost(leader, now):
                    continue  # the run's leader pages it, from the digest on its way there
                findings = [f.seen_partially(self.links.why(leader, now)) for f in findings]
            elif findings and live is not None and self.placement.leads(live.state):
                # Its in-order copy is judged with every node's ranks (which rank went NaN
                # first), and what a node sidecar paged while this one was away arrives with
                # the node's digests: one rank's preview would page that rank as the origin,
                # and page again what the node paged (a restarted leader's ranks preview
                # their spooled NaN steps before the node has caught it up).
                continue
            if findings:
                context = (views.context(live.state) if live is not None
                           else views.bare_context(record))
                result.begun += self.alerts.preview(context, findings, now)
        return result

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

    # -- one run, one brain (monitor_agent/cluster) ----------------------------------------

    def ingest_peer(self, batch: PeerBatch, now: float) -> IngestResult:
        """A node sidecar's exchange with this one, the leader of its runs
        (pipeline/peer_exchange.py ``PeerExchange.exchange``); its TCP figures folded
        into the runs taken (pipeline/link_figures.py)."""
        result = self.peers.exchange(batch, now)
        self.link_figures.from_peer(batch, result.deferred, now)
        return result

    def own_links(self, sample: LinkSample, now: float) -> None:
        """This host's TCP figures (cluster/tcp_probe.py), for the runs it leads."""
        self.link_figures.from_self(sample, now)

    def followed(self) -> list[tuple[str, PeerRun]]:
        """(leader, run) for every run in memory this sidecar forwards to a leader."""
        return self.peers.followed()

    def page_stranded(self, leader: str, now: float, why: str | None,
                      run_id: str | None = None) -> int:
        """Page here what is owed to ``leader`` and nobody paged
        (``PeerExchange.page_stranded``); how many."""
        return self.peers.page_stranded(leader, now, why, run_id)

    def acted(self, run_id: str, actions: list[Action], now: float) -> None:
        """Actions decided for a run, here or (on a node sidecar) adopted from its leader."""
        self.consequences.acted(run_id, actions, now)


    # -- the clock ------------------------------------------------------------------------

    def recover(self, now: float) -> int:
        """Reload the runs that were active before a restart; return how many."""
        return self.registry.recover(now)

    def tick(self, now: float) -> list[Finding]:
        """Stall checks, alert resolves, expiry, snapshots and retention; call every second
        (pipeline/clock.py)."""
        return self.clock.tick(now)
