"""The clock: what a tick does (every second, on the engine thread). Per run: the goodput
view for /metrics, a deferred rollback whose wait ran out, the detectors' clock (silence,
hang, stall: a run quiet as a whole is a lifecycle event). Then the alerts' own clock,
expiry of silent runs, snapshots on a timer, retention, and the self-metrics."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from monitor_agent.alerting.sink import AlertSink
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.batch import IngestResult
from monitor_agent.pipeline.batch_end import BatchEnd
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.pipeline.retention import Retention
from monitor_agent.pipeline.routing import Router
from monitor_agent.records.types import Finding
from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

log = logging.getLogger(__name__)


class Clock:
    """Drives the clock through each run in memory, and the housekeeping that follows."""

    def __init__(self, settings: Settings, store: Store, metrics: SelfMetrics,
                 alerts: AlertSink, registry: RunRegistry, retention: Retention,
                 router: Router, consequences: Consequences, batch_end: BatchEnd) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.alerts = alerts
        self.registry = registry
        self.retention = retention
        self.router = router
        self.consequences = consequences
        self.batch_end = batch_end
        self._last_snapshot = 0.0
        self._ticked = IngestResult()  # what a tick owes the leaders, queued at its end

    def tick(self, now: float) -> list[Finding]:
        """Stall checks, alert resolves, expiry, snapshots and retention; call every second."""
        self.registry.reload_evicted(now)
        findings: list[Finding] = []
        for live in self.registry:
            self._goodput_view(live.state, now)
            findings.extend(self._tick_run(live, now))
        if findings:
            self.store.insert_findings([f.to_dict() for f in findings])
        self.batch_end.queue_and_count(self._ticked)
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

    def _goodput_view(self, run: RunState, now: float) -> None:
        """Report the run's goodput ledger where /metrics reads it, when it moved (or a
        hang is open: its cost grows with the clock, the run's own)."""
        book = run.goodput
        view = run.goodput_view
        if view is not None and book.hang is None and view.rows_seen == book.last_row:
            return
        run.goodput_view = book.report(run.clock(now))
        run.changed()

    def _tick_run(self, live: LiveRun, now: float) -> list[Finding]:
        """One run's share of a tick: its deferred rollback decided if the wait is over,
        then the detectors' clock (stall, hang); a silence of the whole run is a lifecycle
        event, and what they found is routed as a record's findings are."""
        run = live.state
        self.consequences.decide_deferred_rollback(run, now, self._ticked)  # a wait that ran out with nothing arriving
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
            self.consequences.events(live, live.lifecycle.went_silent(run.last_step, *silence), now)
        if found:
            found = [dataclasses.replace(f, attempt=max(live.attempts.current, 1))
                     for f in found]
            result = IngestResult()
            self.router.route(run, found, now, result)
            self._ticked.uplink.extend(result.uplink)
            return result.findings
        return found

    def _count_runs(self) -> None:
        """The runs in memory by state (``monitor_runs``)."""
        counts = {"running": 0, "ended": 0}
        for run in self.registry.states():
            counts["running" if run.status == "running" else "ended"] += 1
        for state, value in counts.items():
            self.metrics.runs.labels(state=state).set(value)


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
