"""Hand alerts to the user's Alertmanager (every member of an HA cluster) via /api/v2/alerts.

Teams that already route pages through Alertmanager keep doing so, and several sidecars
can feed one cluster: Alertmanager deduplicates on labels. Like Prometheus, firing alerts
are re-sent every ``refresh_interval`` with ``endsAt`` a few intervals ahead (so a dead
sidecar's alerts time out), and a resolve is an alert whose ``endsAt`` has passed.

Labels are only the stable identity of the alert (alertname, run_id, project, severity, the
fingerprint's layer/rank, the run's own labels): anything that changes between findings
would make Alertmanager see a new alert. Everything else goes into annotations, each at
most ``MAX_ANNOTATION`` characters (Alertmanager documents no limit, but what it forwards
them to does: Slack's 3000 a section, PagerDuty's 1024 a summary); a longer one keeps its
start (``format.cut_text``: the culprit is named first).

``endsAt`` is computed when a message is sent, not when it was queued: a retry delivered
after an outage would otherwise arrive already expired, i.e. resolved. Alertmanager answers
400 to a whole batch when one alert is invalid, after storing the valid ones; the batch is
then sent again one alert at a time, so the valid ones count as delivered and only the
invalid one fails, by name.

Two members of a cluster, and what they are sent for one alert at t=60 (an
``httpx.MockTransport`` standing in for the cluster shows ``send``: one member is enough)::

    >>> am = AlertmanagerNotifier(["http://am-0:9093", "http://am-1:9093/"], refresh_interval=60)
    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=0.0, step=300, identity={"layer": "fc1"})
    >>> note = Notification("gpt-7", (event,), created_at=0.0)
    >>> [alert] = am.payload(note, now=60.0)
    >>> alert["labels"]
    {'alertname': 'TrainingNanInf', 'run_id': 'gpt-7', 'severity': 'critical',
     'source': 'monitor-agent', 'layer': 'fc1'}
    >>> alert["startsAt"], alert["endsAt"]   # ends four refresh intervals after sending
    ('1970-01-01T00:00:00Z', '1970-01-01T00:05:00Z')
    >>> one_up = httpx.MockTransport(
    ...     lambda request: httpx.Response(200 if request.url.host == "am-0" else 503))
    >>> with httpx.Client(transport=one_up) as client:
    ...     am.send(note, client).detail
    '1/2 members: 200'
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from monitor_agent.notify import format as fmt
from monitor_agent.notify.base import AlertEvent, Notification, Outcome, OutcomeKind, post_json

log = logging.getLogger(__name__)
_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
MAX_ANNOTATION = 4000


class AlertmanagerNotifier:
    """Posts to each Alertmanager; ok when at least one accepted (they gossip)."""

    name = "alertmanager"
    grouped = True
    min_interval = 0.0
    statuses = frozenset({"firing", "resolved"})

    def __init__(self, urls: list[str], refresh_interval: float = 60.0, timeout: float = 5.0,
                 clock: Callable[[], float] = time.time) -> None:
        self.urls = [u.rstrip("/") + "/api/v2/alerts" for u in urls]
        self.refresh_interval = refresh_interval
        self.timeout = timeout
        self.clock = clock

    def send(self, note: Notification, client: httpx.Client) -> Outcome:
        body = self.payload(note, now=self.clock())
        outcomes = [self._post(client, url, body) for url in self.urls]
        ok = [o for o in outcomes if o.kind is OutcomeKind.OK]
        if ok:
            return Outcome.ok(f"{len(ok)}/{len(outcomes)} members: {ok[0].detail}")
        retry = [o for o in outcomes if o.kind is OutcomeKind.RETRY]
        return retry[0] if retry else outcomes[0]

    def _post(self, client: httpx.Client, url: str, body: list[dict[str, Any]]) -> Outcome:
        outcome = post_json(client, url, body, self.timeout)
        if len(body) < 2 or outcome.kind is not OutcomeKind.PERMANENT \
                or not outcome.detail.startswith("HTTP 400"):
            return outcome
        # One invalid alert fails the batch, but the valid ones are stored: find which.
        singles = [post_json(client, url, [alert], self.timeout) for alert in body]
        refused = [f"{a['labels'].get('alertname')}: {o.detail}" for a, o in zip(
            body, singles, strict=True) if o.kind is not OutcomeKind.OK]
        if len(refused) == len(body):
            return singles[0]
        if any(o.kind is OutcomeKind.RETRY for o in singles):
            return next(o for o in singles if o.kind is OutcomeKind.RETRY)
        log.error("alertmanager %s refused %d of %d alerts: %s", url, len(refused), len(body),
                  "; ".join(refused)[:500])
        detail = f"{len(body) - len(refused)}/{len(body)} alerts accepted; refused: "
        return Outcome.ok((detail + "; ".join(refused))[:500])

    def payload(self, note: Notification, now: float | None = None) -> list[dict[str, Any]]:
        # Four resend intervals of slack, as Prometheus does, before Alertmanager times out;
        # from the moment of sending (``now``), so a late retry is not born expired.
        sent = note.created_at if now is None else now
        expires = sent + 4 * self.refresh_interval
        return [self._alert(e, expires) for e in note.events]

    def _alert(self, e: AlertEvent, expires: float) -> dict[str, Any]:
        alert: dict[str, Any] = {
            "labels": labels(e),
            "annotations": _annotations(e),
            "startsAt": _iso(e.started_at),
            "endsAt": _iso(e.ends_at if e.status == "resolved" and e.ends_at else expires),
        }
        if e.dashboard_url:
            alert["generatorURL"] = e.dashboard_url
        return alert


def labels(e: AlertEvent) -> dict[str, str]:
    out = {k: v for k, v in e.labels.items() if _LABEL_NAME.match(k) and v}
    out.update({"alertname": e.alertname, "run_id": e.run_id, "severity": e.severity,
                "source": "monitor-agent"})
    if e.project:
        out["project"] = e.project
    out.update({k: v for k, v in e.identity.items() if v})
    return out


def _annotations(e: AlertEvent) -> dict[str, str]:
    notes = {"summary": e.summary, "description": fmt.headline(e), "type": e.type,
             "fingerprint": e.fingerprint}
    if e.step is not None:
        notes["step"] = str(e.step)
    if e.layer:
        notes["layer"] = e.layer
    if (value := fmt.value_line(e)) is not None:
        notes["value"] = value
    if e.suggestions:
        notes["suggestion"] = e.suggestions[0]
        notes["suggestions"] = "\n".join(e.suggestions)
    if e.dashboard_url:
        notes["dashboard"] = e.dashboard_url
    return {k: fmt.cut_text(v, MAX_ANNOTATION) for k, v in notes.items()}


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")
