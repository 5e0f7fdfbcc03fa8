"""A generic JSON webhook: the alerts of one run, shaped like Alertmanager's webhook body.

``{"version": "1", "status": "firing", "groupKey": "<run_id>", "alerts": [...]}``, each
alert with every field of ``AlertEvent`` (NaN spelled "NaN"). 2xx is delivered; 408, 429
and 5xx are retried; other 4xx are not.

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

import httpx

from monitor_agent.notify.base import Notification, Outcome, post_json

VERSION = "1"


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
        return {
            "version": VERSION,
            "status": note.status,
            "groupKey": note.group,
            "createdAt": note.created_at,
            "alerts": [e.to_dict() for e in note.events],
        }
