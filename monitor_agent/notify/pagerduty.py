"""PagerDuty Events API v2: trigger, acknowledge and resolve, one event per alert.

The ``dedup_key`` is derived from the alert's fingerprint, so a re-sent trigger (retry,
repeat, a second sidecar) lands on the same incident and the resolve closes it. 429 and
5xx are retried by the outbox; 400 means the event is invalid and is not.

An event stays within the Events API's limits, so a large alert is never refused (a lost
page): a summary of at most 1024 characters and at most ``MAX_EVENT_BYTES`` in all, its
evidence cut by the rule that keeps the culprit (``format.fit_evidence``).

What a trigger and its resolve carry (``send`` POSTs these; tests/notify/test_outbox.py
sends them to a local receiver that answers as PagerDuty does)::

    >>> from dataclasses import replace
    >>> pd = PagerDutyNotifier("R0UT1NGKEY0123456789abcdef012345",
    ...                        url="https://events.pagerduty.com/v2/enqueue")
    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=0.0, step=300)
    >>> trigger = pd.payload(event)
    >>> trigger["event_action"], trigger["dedup_key"], trigger["payload"]["summary"]
    ('trigger', 'monitor-agent-ab12', 'CRITICAL TrainingNanInf (run gpt-7, step 300): loss is NaN')
    >>> pd.payload(replace(event, status="resolved"))   # the same dedup_key closes the incident
    {'routing_key': 'R0UT1NGKEY0123456789abcdef012345', 'event_action': 'resolve',
     'dedup_key': 'monitor-agent-ab12'}
    >>> pd
    PagerDutyNotifier(url='https://events.pagerduty.com/v2/enqueue', routing_key=**********)
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import httpx

from monitor_agent.notify import format as fmt
from monitor_agent.notify.base import AlertEvent, Notification, Outcome, OutcomeKind, post_json
from monitor_agent.records import wire

_ACTIONS = {"firing": "trigger", "resolved": "resolve", "acknowledged": "acknowledge"}
# PagerDuty's severities are exactly ours: critical, error, warning, info.
_SEVERITIES = ("critical", "error", "warning", "info")
MAX_EVENT_BYTES = 512_000
"""The Events API v2 takes events of at most 512 KB (its overview, "Size Limits"): 512,000
bytes of JSON is within that whichever kilobyte is meant."""
MAX_SUMMARY = 1024  # characters of ``payload.summary`` (documented)


def dedup_key(fingerprint: str) -> str:
    return f"monitor-agent-{fingerprint}"


class PagerDutyNotifier:
    """Sends Events API v2 events with one integration's routing key."""

    name = "pagerduty"
    grouped = False
    min_interval = 0.0
    statuses = frozenset(_ACTIONS)
    refresh_interval = None

    def __init__(self, routing_key: str, url: str, timeout: float = 5.0) -> None:
        self._key = routing_key
        self.url = url
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"PagerDutyNotifier(url={self.url!r}, routing_key=**********)"

    def send(self, note: Notification, client: httpx.Client) -> Outcome:
        # The outbox hands us one alert at a time (grouped=False); a retry of several is
        # harmless because PagerDuty deduplicates on dedup_key.
        for event in note.events:
            outcome = post_json(client, self.url, self.payload(event), self.timeout)
            if outcome.kind is not OutcomeKind.OK:
                return outcome
        return Outcome.ok()

    def payload(self, e: AlertEvent) -> dict[str, Any]:
        body: dict[str, Any] = {
            "routing_key": self._key,
            "event_action": _ACTIONS[e.status],
            "dedup_key": dedup_key(e.fingerprint),
        }
        if e.status != "firing":
            return body
        body["payload"] = {
            "summary": fmt.cut_text(fmt.headline(e), MAX_SUMMARY),
            "source": f"monitor-agent/{e.run_id}",
            "severity": e.severity if e.severity in _SEVERITIES else "error",
            "timestamp": datetime.fromtimestamp(e.started_at, UTC).isoformat(),
            "component": e.layer or "model",
            "group": e.project or e.run_id,
            "class": e.type,
            "custom_details": _details(e),
        }
        body["client"] = "monitor-agent"
        if e.dashboard_url:
            body["client_url"] = e.dashboard_url
            body["links"] = [{"href": e.dashboard_url, "text": f"Grafana: run {e.run_id}"}]
        return _within_limit(body, e)


def _within_limit(body: dict[str, Any], e: AlertEvent) -> dict[str, Any]:
    """The event as it is when it fits ``MAX_EVENT_BYTES``, else with its evidence cut to
    what is left (everything else of an event is small)."""
    size = len(wire.dumps(body))
    if size <= MAX_EVENT_BYTES:
        return body
    details = body["payload"]["custom_details"]
    room = MAX_EVENT_BYTES - (size - len(wire.dumps(details["evidence"])))
    details["evidence"] = fmt.fit_evidence(
        details["evidence"], room, fmt.culprit(e),
        whole=f"GET /v1/runs/{quote(e.run_id, safe='')}/findings")
    return body


def _details(e: AlertEvent) -> dict[str, Any]:
    details: dict[str, Any] = {
        "alertname": e.alertname, "run_id": e.run_id, "step": e.step, "layer": e.layer,
        "rank": e.rank, "value": fmt.num(e.value), "baseline": fmt.num(e.threshold),
        "findings": e.count, "suggestions": list(e.suggestions), "labels": e.labels,
    }
    # Evidence numbers may be NaN/inf, which JSON cannot carry: spelled out; and it names
    # the finding it belongs to (an alert gathers many).
    details["evidence"] = fmt.evidence(e)
    return details
