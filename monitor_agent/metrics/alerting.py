"""Alerting's self-metrics: delivery (``metrics/delivery.py``) plus decisions by reason.

On the registry the app passes in, every series pre-created.

Example::

    m = AlertingMetrics(CollectorRegistry(), channels=["slack"])
    m.decisions.labels(reason="first").inc()
    m.notifications.labels(channel="slack", outcome="sent").inc()
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from monitor_agent.metrics import names
from monitor_agent.metrics.delivery import BUCKETS, OUTCOMES, UNDELIVERED, DeliveryMetrics

__all__ = ["BUCKETS", "OUTCOMES", "REASONS", "UNDELIVERED", "AlertingMetrics"]

REASONS: tuple[str, ...] = (
    "first", "repeat_elapsed", "resolved", "suppressed", "cooldown", "silenced",
    "acknowledged", "replayed", "log_only", "unmatched", "previewed",
)


class AlertingMetrics(DeliveryMetrics):
    """The outbox's delivery metrics and the lifecycle's decisions, on one registry."""

    def __init__(self, registry: CollectorRegistry, channels: Iterable[str]) -> None:
        super().__init__(registry, channels)
        self.decisions = Counter(
            names.ALERT_DECISIONS, "Alerting decisions by reason.", ["reason"], registry=registry
        )
        for reason in REASONS:
            self.decisions.labels(reason=reason)
