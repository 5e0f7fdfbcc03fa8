"""Silences: mute alerts by run, finding type, alert name and/or layer, for a duration.

A silenced alert is still tracked (and listed as silenced); it is not sent. When the
silence ends while the alert still fires, people hear of it then.

An hour's silence of one run's loss spikes, and a silence that would mute everything::

    >>> s = Silence.new(run_id="gpt-7", type="loss_spike", duration=3600, now=1000.0,
    ...                 created_by="ana", comment="known bad shard")
    >>> s.active(now=2000.0), s.active(now=4600.0)
    (True, False)
    >>> s.covers(run_id="gpt-7", type="loss_spike", alertname="TrainingLossSpike", layer=None)
    True
    >>> s.covers(run_id="gpt-8", type="loss_spike", alertname="TrainingLossSpike", layer=None)
    False
    >>> Silence.new(duration=3600, now=1000.0, comment="everything")
    Traceback (most recent call last):
    ...
    ValueError: a silence needs at least one of: run_id, type, alertname, layer
"""

from __future__ import annotations

import uuid
from dataclasses import asdict, dataclass
from typing import Any

from monitor_agent.alerting.alerts import StoredAlert

MATCHERS: tuple[str, ...] = ("run_id", "type", "alertname", "layer")


@dataclass(frozen=True, slots=True)
class Silence:
    """Every matcher that is set must equal the alert's; at least one must be set."""

    id: str
    comment: str
    created_by: str
    created_at: float
    ends_at: float
    run_id: str | None = None
    type: str | None = None
    alertname: str | None = None
    layer: str | None = None

    @classmethod
    def new(cls, *, duration: float, now: float, comment: str = "", created_by: str = "",
            **matchers: str | None) -> Silence:
        if not any(matchers.get(m) for m in MATCHERS):
            raise ValueError(f"a silence needs at least one of: {', '.join(MATCHERS)}")
        if duration <= 0:
            raise ValueError("duration_seconds must be positive")
        return cls(id=uuid.uuid4().hex, comment=comment, created_by=created_by,
                   created_at=now, ends_at=now + duration,
                   **{m: matchers.get(m) or None for m in MATCHERS})

    def active(self, now: float) -> bool:
        return self.created_at <= now < self.ends_at

    def covers(self, **alert: Any) -> bool:
        return all(getattr(self, m) is None or getattr(self, m) == alert.get(m) for m in MATCHERS)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def silenced_by(active: list[Silence], alert: StoredAlert) -> bool:
    """Whether any of the ``active`` silences covers the alert."""
    return any(s.covers(run_id=alert.run_id, type=alert.type, alertname=alert.rule,
                        layer=alert.layer) for s in active)
