"""The sidecar's own metrics (``monitor_agent_*``), built on a registry passed in.

Every label combination a dashboard or alert rule needs is created up front, so the series
exist from the first scrape instead of appearing only after the first failure.

Ten records accepted; a rejection reason nobody has hit yet is already a series::

    >>> registry = CollectorRegistry()
    >>> m = SelfMetrics(registry, version="1.2.3")
    >>> m.records.labels(outcome="accepted").inc(10)
    >>> registry.get_sample_value(names.INGEST_RECORDS + "_total", {"outcome": "accepted"})
    10.0
    >>> registry.get_sample_value(names.INGEST_REJECTIONS + "_total", {"reason": "too_large"})
    0.0
    >>> registry.get_sample_value(names.BUILD_INFO, {"version": "1.2.3"})
    1.0
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from monitor_agent.metrics import names

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
REJECT_REASONS = ("invalid", "too_many_runs", "body", "auth", "too_large", "unavailable")


class SelfMetrics:
    """Counters and histograms about ingest, storage, detection and rendering."""

    def __init__(self, registry: CollectorRegistry, version: str = "") -> None:
        self.requests = Counter(
            names.INGEST_REQUESTS, "Ingest requests by HTTP status code.", ["code"],
            registry=registry,
        )
        self.records = Counter(
            names.INGEST_RECORDS, "Ingested records by outcome.", ["outcome"], registry=registry
        )
        self.rejections = Counter(
            names.INGEST_REJECTIONS, "Rejected records or requests by reason.", ["reason"],
            registry=registry,
        )
        self.ingest_duration = Histogram(
            names.INGEST_DURATION, "Ingest request latency, receipt to acknowledgement.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.store_duration = Histogram(
            names.STORE_DURATION, "Latency of one batched SQLite write transaction.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.detector_duration = Histogram(
            names.DETECTOR_DURATION, "Detector time per record.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.render_duration = Histogram(
            names.RENDER_DURATION, "Time to render /metrics.",
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.dropped_series = Counter(
            names.DROPPED_SERIES, "Series left out of /metrics by the cardinality caps.",
            ["reason"], registry=registry,
        )
        self.runs = Gauge(names.RUNS, "Runs held in memory by state.", ["state"], registry=registry)
        self.ready = Gauge(names.READY, "1 when the sidecar can store records.", registry=registry)
        self.detector_errors = Counter(
            "monitor_agent_detector_errors", "Detector exceptions (the record is still stored).",
            registry=registry,
        )
        self.background_errors = Counter(
            names.BACKGROUND_SKIPPED, "Items a background thread could not process and "
            "skipped (each logged), by part; the thread goes on.", ["part"],
            registry=registry,
        )
        for part in ("chart_history", "exposition"):
            self.background_errors.labels(part=part)
        self.ticks = Counter(
            names.TICKS, "Engine ticks done (stall and hang checks, alert resolves, snapshots, "
            "retention): the clock-driven work; a tick started after a write has seen it.",
            registry=registry)
        self.leader_exchanges = Counter(
            names.LEADER_EXCHANGES, "A node sidecar's exchanges with its run leaders, by "
            "outcome (ok, failed, refused).", ["outcome"], registry=registry)
        self.uplink_queued = Gauge(
            names.UPLINK_QUEUED, "Digests and findings a node sidecar owes its run leaders.",
            registry=registry)
        self.uplink_dropped = Counter(
            names.UPLINK_DROPPED, "Step digests let go because a leader stayed away past "
            "cluster.uplink_max_rows.", registry=registry)
        self.uplink_bytes = Counter(
            names.UPLINK_BYTES, "Bytes a node sidecar posted to its run leaders (gzip).",
            registry=registry)
        self.peer_items = Counter(
            names.PEER_ITEMS, "What this sidecar, as a run leader, received from node "
            "sidecars, by kind (digest, finding, heartbeat).", ["kind"], registry=registry)
        for outcome in ("ok", "failed", "refused"):
            self.leader_exchanges.labels(outcome=outcome)
        for kind in ("digest", "finding", "heartbeat"):
            self.peer_items.labels(kind=kind)
        self.node_drained = Gauge(
            names.NODE_DRAINED, "1 while a run's leader has left this node out (GET /v1/node; "
            "cluster/drain.py), until DELETE /v1/node/drain.", registry=registry)
        build = Gauge(names.BUILD_INFO, "Build information.", ["version"], registry=registry)
        build.labels(version=version).set(1)
        for outcome in ("accepted", "duplicate", "rejected", "late"):
            self.records.labels(outcome=outcome)
        for reason in REJECT_REASONS:
            self.rejections.labels(reason=reason)
        for reason in ("max_runs", "max_layers", "max_ranks", "max_layer_names"):
            self.dropped_series.labels(reason=reason)
        for state in ("running", "ended", "stalled"):
            self.runs.labels(state=state)
        for code in ("200", "400", "401", "413", "415", "429", "503"):
            self.requests.labels(code=code)
