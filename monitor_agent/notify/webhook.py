"""A generic JSON webhook: the alerts of one run, shaped like Alertmanager's webhook body.

``{"version": "1", "status": "firing", "groupKey": "<run_id>", "alerts": [...]}``, each
alert with every field of ``AlertEvent`` (NaN spelled "NaN"). 2xx is delivered; 408, 429
and 5xx are retried; other 4xx are not.

A body is at most ``MAX_BODY_BYTES``: over it, each alert over its equal share has its
summary and evidence cut by the rule that keeps the culprit (``format.fit_evidence``).

The body of one alert, and its send to a receiver (an ``httpx.MockTransport`` here)::

    >>> from monitor_agent.notify.base import AlertEvent
    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=1000.0, value=float("nan"))
    >>> note = Notification("gpt-7", (event,), created_at=1001.0)
    >>> body = WebhookNotifier.payload(note)
    >>> body["status"], body["groupKey"], [a["alertname"] for a in body["alerts"]]
    ('firing', 'gpt-7', ['TrainingNanInf'])
    >>> got = []
    >>> receiver = httpx.MockTransport(lambda req: got.append(req.content) or httpx.Response(202))
    >>> with httpx.Client(transport=receiver) as client:
    ...     WebhookNotifier("https://ops.example.com/hooks/t0k3n").send(note, client).kind
    <OutcomeKind.OK: 'ok'>
    >>> b'"value":"NaN"' in got[0]
    True
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import httpx

from monitor_agent.notify import format as fmt
from monitor_agent.notify.base import Notification, Outcome, post_json
from monitor_agent.records import wire

VERSION = "1"
MAX_BODY_BYTES = 1 << 20
"""A generic receiver documents no limit, but the proxy most often in front of one refuses a
larger body by default (nginx's ``client_max_body_size``: 1 MiB, answered 413), and a
refused page is a lost page."""


class WebhookNotifier:
    """POSTs every notification as JSON to one URL (which may embed a token: a secret)."""

    name = "webhook"
    grouped = True
    min_interval = 0.0
    statuses = frozenset({"firing", "resolved", "acknowledged"})
    refresh_interval = None

    def __init__(self, url: str, timeout: float = 5.0) -> None:
        self._url = url
        self.timeout = timeout

    def __repr__(self) -> str:
        return "WebhookNotifier(url=**********)"

    def send(self, note: Notification, client: httpx.Client) -> Outcome:
        return post_json(client, self._url, self.payload(note), self.timeout)

    @staticmethod
    def payload(note: Notification) -> dict[str, Any]:
        alerts = [e.to_dict() for e in note.events]
        body = {
            "version": VERSION,
            "status": note.status,
            "groupKey": note.group,
            "createdAt": note.created_at,
            "alerts": alerts,
        }
        sizes = [len(wire.dumps(a)) for a in alerts]
        envelope = len(wire.dumps({**body, "alerts": []})) + len(alerts)
        if envelope + sum(sizes) <= MAX_BODY_BYTES:
            return body
        share = (MAX_BODY_BYTES - envelope) // len(alerts)
        for alert, event, size in zip(alerts, note.events, sizes, strict=True):
            if size <= share:
                continue
            alert["summary"] = fmt.cut_text(alert["summary"], share // 8)  # <= 4 bytes a char
            rest = len(wire.dumps({**alert, "evidence": {}}))
            alert["evidence"] = fmt.fit_evidence(
                alert["evidence"], share - rest, fmt.culprit(event),
                whole=f"GET /v1/runs/{quote(event.run_id, safe='')}/findings")
        return body
