"""Delivery self-metrics: notifications by channel and outcome, latency, outbox depth.

The outbox counts into these; ``metrics/alerting.py`` extends them with alerting's own
decisions. Every series is pre-created so dashboards show zeros, not gaps.

One Slack message sent, as /metrics shows it (a reason to give up, still at zero)::

    >>> from prometheus_client import generate_latest
    >>> registry = CollectorRegistry()
    >>> m = DeliveryMetrics(registry, channels=["slack"])
    >>> m.notifications.labels(channel="slack", outcome="sent").inc()
    >>> for line in generate_latest(registry).decode().splitlines():
    ...     if "_total{" in line and ('outcome="sent"' in line or 'reason="http_404"' in line):
    ...         print(line)
    monitor_agent_notifications_total{channel="slack",outcome="sent"} 1.0
    monitor_agent_notifications_undelivered_total{channel="slack",reason="http_404"} 0.0
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from monitor_agent.metrics import names

# summarised: a new run's message folded into its source's summary, or a follow-up of
# one that was (notify/fairness.py), instead of a message of its own.
OUTCOMES: tuple[str, ...] = ("sent", "retried", "failed", "dropped", "summarised")
# Why a notification was given up on (a bounded set: the label must not take free text).
UNDELIVERED: tuple[str, ...] = (
    "http_400", "http_401", "http_403", "http_404", "http_410", "http_413", "http_other",
    "expired", "max_attempts", "internal_error", "outbox_full",
)
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class DeliveryMetrics:
    """Notifications by channel/outcome, undelivered by reason, send latency, outbox depth."""

    def __init__(self, registry: CollectorRegistry, channels: Iterable[str]) -> None:
        self.notifications = Counter(
            names.NOTIFICATIONS, "Notification deliveries by channel and outcome.",
            ["channel", "outcome"], registry=registry,
        )
        self.undelivered = Counter(
            names.NOTIFICATIONS_UNDELIVERED, "Notifications given up on, by channel and reason "
            "(each also an ERROR log line and a delivery state on GET /v1/alerts).",
            ["channel", "reason"], registry=registry,
        )
        self.duration = Histogram(
            names.NOTIFICATION_DURATION, "Latency of one delivery attempt, by channel.",
            ["channel"], buckets=BUCKETS, registry=registry,
        )
        self.pending = Gauge(
            names.OUTBOX_PENDING, "Notifications waiting in the outbox.", registry=registry
        )
        self.oldest_pending = Gauge(
            names.OUTBOX_OLDEST_PENDING, "Age of the channel's oldest undelivered notification "
            "(0 when none): a page that is stuck shows here long before max_age ends it.",
            ["channel"], registry=registry,
        )
        self.deadline_exceeded = Counter(
            names.NOTIFICATION_DEADLINE_EXCEEDED, "Delivery attempts cut off at "
            "attempt_timeout_seconds (each also a failed attempt, retried on its schedule).",
            ["channel"], registry=registry,
        )
        for channel in channels:
            self.duration.labels(channel=channel)
            self.oldest_pending.labels(channel=channel)
            self.deadline_exceeded.labels(channel=channel)
            for outcome in OUTCOMES:
                self.notifications.labels(channel=channel, outcome=outcome)
            for reason in UNDELIVERED:
                self.undelivered.labels(channel=channel, reason=reason)
