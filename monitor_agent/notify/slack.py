"""Slack incoming webhook with Block Kit: what happened, where, the numbers, what to try.

Every message carries a ``text`` fallback (notifications, screen readers) and ``blocks``:
a header, one section per alert (run, step, layer, value vs baseline, suggestions), and a
button to the Grafana dashboard with the run selected around the step. Slack allows about
one message per second per webhook, hence ``min_interval``; a 429 carries Retry-After.

Example::

    slack = SlackNotifier(webhook_url, min_interval=1.0)
    outcome = slack.send(note, client)
"""

from __future__ import annotations

from typing import Any

import httpx

from monitor_agent.notify import format as fmt
from monitor_agent.notify.base import AlertEvent, Notification, Outcome, post_json

MAX_ALERTS_SHOWN = 10  # Slack allows 50 blocks; 4 per alert plus the header stays under it.
_ICON = {"critical": ":red_circle:", "error": ":large_orange_circle:",
         "warning": ":large_yellow_circle:", "info": ":large_blue_circle:"}


class SlackNotifier:
    """Posts Block Kit messages to one Slack incoming webhook."""

    name = "slack"
    grouped = True
    statuses = frozenset({"firing", "resolved", "acknowledged"})
    refresh_interval = None

    def __init__(self, webhook_url: str, min_interval: float = 1.0, timeout: float = 5.0) -> None:
        self._url = webhook_url
        self.min_interval = min_interval
        self.timeout = timeout

    def __repr__(self) -> str:  # the URL is the secret
        return "SlackNotifier(webhook_url=**********)"

    def send(self, note: Notification, client: httpx.Client) -> Outcome:
        return post_json(client, self._url, self.payload(note), self.timeout)

    def payload(self, note: Notification) -> dict[str, Any]:
        return {"text": _escape(fmt.plain(note))[:3000], "blocks": blocks(note)}


def blocks(note: Notification) -> list[dict[str, Any]]:
    icon = ":white_check_mark:" if note.status == "resolved" else _ICON.get(
        max(note.events, key=_rank).severity, ":bell:")
    out: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": f"{icon} {fmt.title(note)}"[:150],
                                    "emoji": True}},
    ]
    for event in note.events[:MAX_ALERTS_SHOWN]:
        out.extend(_event_blocks(event))
    hidden = len(note.events) - MAX_ALERTS_SHOWN
    if hidden > 0:
        out.append(_context(f"and {hidden} more alerts of this run; see /v1/alerts"))
    return out


def _rank(event: AlertEvent) -> int:
    return ("info", "warning", "error", "critical").index(event.severity) if event.severity in _ICON else 0


def _event_blocks(e: AlertEvent) -> list[dict[str, Any]]:
    out = [{"type": "section", "text": {"type": "mrkdwn", "text": _section_text(e)[:3000]}}]
    facts = [f"severity *{e.severity}*", f"{e.count} finding{'s' if e.count != 1 else ''}"]
    if e.project:
        facts.insert(0, f"project *{_escape(e.project)}*")
    if e.acked_by:
        facts.append(f"acknowledged by {_escape(e.acked_by)}")
    out.append(_context(" · ".join(facts)))
    if e.dashboard_url:
        out.append({"type": "actions", "elements": [{
            "type": "button", "text": {"type": "plain_text", "text": "Open in Grafana"},
            "url": e.dashboard_url[:3000],
        }]})
    out.append({"type": "divider"})
    return out


def _section_text(e: AlertEvent) -> str:
    status = {"resolved": "Resolved: ", "acknowledged": "Acknowledged: "}.get(e.status, "")
    lines = [f"*{status}{_escape(e.alertname)}*: {_escape(e.summary)}",
             f"*Where:* {_escape(fmt.where(e))}"]
    if (value := fmt.value_line(e)) is not None:
        lines.append(f"*Measured:* {value}")
    if e.status == "firing" and e.suggestions:
        lines.append("*What to try:*")
        lines.extend(f"• {_escape(s)}" for s in e.suggestions[:3])
    return "\n".join(lines)


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": text[:3000]}]}


def _escape(text: str) -> str:
    # Slack's mrkdwn gives &, < and > control meaning (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
