"""The end of a batch: its findings stored, what it owes the run leaders this sidecar
follows queued for them (and paged here when the queue's bound drops it), its records
counted. Every way in (a client's batch, a node sidecar's exchange, a tick) ends here."""

from __future__ import annotations

import time
from collections.abc import Sequence

from monitor_agent.alerting.alerts import RunContext
from monitor_agent.alerting.sink import AlertSink
from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.batch import IngestResult
from monitor_agent.pipeline.registry import RunRegistry
from monitor_agent.records import wire
from monitor_agent.records.types import Finding
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store
from monitor_agent.storage.uplink import UplinkItem


class BatchEnd:
    """Stores, queues and counts what a batch leaves behind."""

    def __init__(self, settings: Settings, store: Store, metrics: SelfMetrics,
                 alerts: AlertSink, registry: RunRegistry, links: LinkBook) -> None:
        self.settings = settings
        self.store = store
        self.metrics = metrics
        self.alerts = alerts
        self.registry = registry
        self.links = links

    def finish(self, result: IngestResult) -> None:
        """Store what a batch (or an exchange, a tick) found, then queue what it owes the
        run leaders and count its records (``queue_and_count``)."""
        if result.findings:
            self.store.insert_findings([f.to_dict() for f in result.findings])
        self.queue_and_count(result)

    def queue_and_count(self, result: IngestResult) -> None:
        """Queue what this sidecar owes the run leaders it follows (stored, then sent by
        cluster/link.py; what the queue's bound drops is paged here), and count the
        batch's records by outcome (``monitor_records_total``)."""
        if result.uplink:
            queue, cluster = self.store.uplink, self.settings.cluster
            queue.put(result.uplink, time.time())
            dropped, unheard = queue.trim(cluster.uplink_max_rows, cluster.uplink_max_bytes)
            if dropped:
                self.metrics.uplink_dropped.inc(dropped)
                # Dropped before any leader had them, and paged by nobody: paged here.
                self.page_owed(unheard, time.time(), "the queue for the run's leader was "
                                "over its bound (cluster.uplink_max_rows/_bytes)")
            self.metrics.uplink_queued.set(queue.rows)
            self.links.queued()
        m = self.metrics.records
        m.labels(outcome="accepted").inc(result.accepted)
        m.labels(outcome="duplicate").inc(result.duplicates)
        m.labels(outcome="late").inc(result.late)

    def page_owed(self, queued: Sequence[UplinkItem], now: float, why: str | None) -> int:
        """Page here the findings ``queued`` for a leader that nobody paged (``why``: said
        in each page as a partial view; None: the run was never followed); how many."""
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
            context = views.context(live.state) if live is not None else RunContext(run_id)
            result.actions.extend(self.alerts.handle(context, findings, now))
        return sum(len(f) for f in by_run.values())
