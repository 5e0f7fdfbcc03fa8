"""The route stage: findings go where the run is judged. Judged here, they are paged (and
rules act on them: pipeline/consequences.py); of a run this sidecar follows, they go to
its leader, and are paged here only while the leader is away, as a partial view. Records
of a followed run go to the leader as digests (``forward``)."""

from __future__ import annotations

from monitor_agent.alerting.sink import AlertSink
from monitor_agent.cluster.digest import digest
from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.detectors.catalogue import RUN_SCOPED_TYPES
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.batch import IngestResult, Mode
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.placement import Placement
from monitor_agent.records import wire
from monitor_agent.records.types import (
    CheckpointRecord,
    EndRecord,
    Finding,
    Record,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import Settings
from monitor_agent.storage.uplink import DROPPABLE, LOCAL_VIEW, PAGED, VITAL, UplinkRow


class Router:
    """Pages findings judged here, hands those of a followed run to its leader."""

    def __init__(self, settings: Settings, alerts: AlertSink, links: LinkBook,
                 placement: Placement, consequences: Consequences) -> None:
        self.settings = settings
        self.alerts = alerts
        self.links = links
        self.placement = placement
        self.consequences = consequences

    def route(self, run: RunState, findings: list[Finding], now: float,
               result: IngestResult, origin: int | None = None) -> None:
        """Findings of a followed run go to its leader, which pages for the whole run; only
        while the leader is away are they paged here, marked as a partial view (and
        forwarded still, so the leader records them without paging them twice)."""
        leader = self.placement.following(run) if origin is None else None
        if leader is None:
            self.handle(run, findings, now, result)
            return
        lost = self.links.lost(leader, now)
        for f in findings:
            flags = (LOCAL_VIEW if f.type in RUN_SCOPED_TYPES else 0) | (PAGED if lost else 0)
            result.uplink.append(UplinkRow(leader, run.run_id, "finding",
                                           wire.dumps(f.to_dict()), flags))
        if lost:
            why = self.links.why(leader, now)
            self.handle(run, [f.seen_partially(why) for f in findings], now, result)
        else:
            run.count_findings(findings)
            result.findings.extend(findings)

    def handle(
        self, run: RunState, findings: list[Finding], now: float, result: IngestResult,
        told: bool = False, closed: bool = False,
    ) -> None:
        """Page (and let rules act on) findings judged here. ``told``: paged already, by
        a node sidecar while this one, the run's leader, was away (recorded, not paged);
        ``closed``: and resolved there too (the run completed while the leader was away:
        recorded as resolved, not resolved twice)."""
        partial = self.partial(run, now)
        if partial is not None:
            findings = [f.seen_partially(f"the run's view is partial: {partial}")
                        for f in findings]
        findings = views.name_nodes(run, findings)
        run.count_findings(findings)
        result.findings.extend(findings)
        context = views.context(run)
        taken = (self.alerts.handle(context, findings, now, told=True, closed=closed) if told
                 else self.alerts.handle(context, findings, now))
        result.actions.extend(taken)
        if taken:
            self.consequences.acted(run.run_id, taken, now)

    def partial(self, run: RunState, now: float) -> str | None:
        """Why the leader's view of a running multi-node run is partial, or None."""
        if run.roster.expected <= 1 or run.status != "running":
            return None
        return run.roster.partial(now, self.settings.cluster.peer_timeout_seconds,
                                  run.first_seen)

    def forward(self, run: RunState, record: Record, body: bytes | None,
                 result: IngestResult, mode: Mode, origin: int | None) -> None:
        """Queue the digest of a record of this sidecar's own ranks for the run's leader
        (not in a ``quiet`` ``Mode``: a run rebuilt from the store, whose records went
        when they came)."""
        leader = self.placement.following(run) if origin is None and not mode.quiet else None
        if leader is None or body is None:
            return
        flags = DROPPABLE if isinstance(record, StepRecord) else \
            VITAL if isinstance(record, RunRecord | CheckpointRecord | EndRecord) else 0
        result.uplink.append(UplinkRow(leader, run.run_id, "record",
                                       digest(record.kind, body), flags))
