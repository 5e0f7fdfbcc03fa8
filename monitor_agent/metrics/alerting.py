"""Alerting's self-metrics: delivery (``metrics/delivery.py``) plus decisions by reason.

On the registry the app passes in, every series pre-created.

A first page counted; the other reasons are there at zero from the start::

    >>> registry = CollectorRegistry()
    >>> m = AlertingMetrics(registry, channels=["slack"])
    >>> m.decisions.labels(reason="first").inc()
    >>> decisions = names.ALERT_DECISIONS + "_total"
    >>> [registry.get_sample_value(decisions, {"reason": r}) for r in ("first", "cooldown")]
    [1.0, 0.0]
    >>> registry.get_sample_value("monitor_agent_notifications_total",
    ...                           {"channel": "slack", "outcome": "sent"})   # from delivery
    0.0
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from monitor_agent.metrics import names
from monitor_agent.metrics.delivery import BUCKETS, OUTCOMES, UNDELIVERED, DeliveryMetrics

__all__ = ["BUCKETS", "OUTCOMES", "REASONS", "UNDELIVERED", "AlertingMetrics"]

REASONS: tuple[str, ...] = (
    "first", "repeat_elapsed", "resolved", "suppressed", "cooldown", "silenced",
    "acknowledged", "replayed", "log_only", "unmatched", "previewed", "grouped",
    "told_elsewhere", "partial_view", "handed_over",
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
