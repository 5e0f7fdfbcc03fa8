"""The alerting data the rest of the sidecar sees: a run's context and an alert's view.

Example::

    ctx = RunContext(run_id="gpt-7", project="gpt", labels={"team": "nlp"})
    for alert in alerting.active_alerts():
        print(alert.alertname, alert.severity, alert.summary, alert.suggestion)
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, field
from typing import Any

from monitor_agent import wire


@dataclass(frozen=True, slots=True)
class RunContext:
    """What alerting needs to know about the run a finding belongs to."""

    run_id: str
    project: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=dict)

    def match_labels(self) -> dict[str, str]:
        """Run labels for rule matching; the project counts as a label too."""
        labels = dict(self.labels)
        if self.project and "project" not in labels:
            labels["project"] = self.project
        return labels


@dataclass(frozen=True, slots=True)
class AlertView:
    """One alert as /v1/alerts, /v1/runs/{id} and the /metrics exposition show it.

    ``state`` is pending, firing or resolved; ``silenced`` is separate because a silenced
    alert still fires (it is just not sent).
    """

    fingerprint: str
    run_id: str
    project: str | None
    rank: int | None
    alertname: str
    type: str
    severity: str
    layer: str | None
    summary: str
    suggestion: str | None
    state: str
    silenced: bool
    started_at: float
    last_seen: float
    last_step: int | None
    count: int
    resolved_at: float | None = None
    acked_by: str | None = None
    acked_at: float | None = None
    dashboard_url: str | None = None
    action: str | None = None  # what a rule asked of the run ("stop requested at step N ...")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: sqlite3.Row, silenced: bool) -> AlertView:
        finding = wire.loads(row["finding"])
        suggestions = finding.get("suggestions") or []
        return cls(
            fingerprint=row["fingerprint"], run_id=row["run_id"], project=row["project"],
            rank=row["rank"], alertname=row["rule"], type=row["type"], severity=row["severity"],
            layer=row["layer"], summary=finding.get("message", ""),
            suggestion=suggestions[0] if suggestions else None, state=row["state"],
            silenced=silenced, started_at=row["started_at"], last_seen=row["last_seen"],
            last_step=row["last_step"], count=row["count"], resolved_at=row["resolved_at"],
            acked_by=row["acked_by"], acked_at=row["acked_at"], dashboard_url=row["dashboard_url"],
            action=row["action"],
        )
