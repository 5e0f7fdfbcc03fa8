"""Slack incoming webhook with Block Kit: what happened, where, the numbers, what to try.

Every message carries a ``text`` fallback (notifications, screen readers) and ``blocks``:
a header, one section per alert (run, step, layer, value vs baseline, suggestions), and a
button to the Grafana dashboard with the run selected around the step. Slack allows about
one message per second per webhook, hence ``min_interval``; a 429 carries Retry-After.

Slack refuses a message whose blocks hold too much text (``msg_blocks_too_long``, reported
by users above ~12,000 characters though no limit is documented), so a message keeps its
block text under ``MAX_BLOCK_TEXT`` by summarising the alerts that do not fit; and any 400
to a Block Kit message is answered by sending the same news again as plain text, so a
refused layout never costs the page. Every block keeps within Block Kit's documented limits
(at most 50 blocks; a header's text 150 characters, a section's 3000, a context element's
3000, a button's 75 and its URL 3000): a long summary is cut from its end
(``format.cut_text``: it names its culprit first) so that where, the measured value and
what to try still show; a URL too long for a button gets no button.

One alert's message, and a send to a receiver that refuses its blocks (an
``httpx.MockTransport`` here; tests/notify/test_slack_delivery.py uses a local receiver
that refuses what Slack refuses)::

    >>> slack = SlackNotifier("https://hooks.slack.com/services/T0/B0/XYZ", min_interval=1.0)
    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=0.0, step=300, suggestions=("lower the lr",))
    >>> note = Notification("gpt-7", (event,), created_at=1.0)
    >>> body = slack.payload(note)
    >>> body["blocks"][0]["text"]["text"], [b["type"] for b in body["blocks"][1:]]
    (':red_circle: [FIRING:1] run gpt-7: TrainingNanInf', ['section', 'context', 'divider'])
    >>> picky = httpx.MockTransport(lambda req: httpx.Response(
    ...     400 if b'"blocks"' in req.content else 200, text="invalid_blocks"))
    >>> with httpx.Client(transport=picky) as client:
    ...     slack.send(note, client).detail
    'sent as plain text after Block Kit was refused (HTTP 400: invalid_blocks)'
"""

from __future__ import annotations

from typing import Any

import httpx

from monitor_agent.notify import format as fmt
from monitor_agent.notify.base import AlertEvent, Notification, Outcome, OutcomeKind, post_json

MAX_ALERTS_SHOWN = 10  # Slack allows 50 blocks; 4 per alert plus the header stays under it.
MAX_BLOCK_TEXT = 10_000  # characters of text in all blocks: under the ~12,000 Slack refuses
MAX_PLAIN_TEXT = 4_000   # Slack truncates longer top-level text
MAX_SECTION_TEXT = 3_000  # Block Kit: a section's text, a context element's, a button's URL
MAX_HEADER_TEXT = 150
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
        outcome = post_json(client, self._url, self.payload(note), self.timeout)
        if outcome.kind is not OutcomeKind.PERMANENT or not outcome.detail.startswith("HTTP 400"):
            return outcome
        plain = post_json(client, self._url, self.plain_payload(note), self.timeout)
        if plain.kind is OutcomeKind.OK:
            return Outcome.ok(f"sent as plain text after Block Kit was refused ({outcome.detail})")
        return plain

    def payload(self, note: Notification) -> dict[str, Any]:
        return {"text": _escape(fmt.plain(note))[:3000], "blocks": blocks(note)}

    def plain_payload(self, note: Notification) -> dict[str, Any]:
        return {"text": _escape(fmt.plain(note))[:MAX_PLAIN_TEXT]}


def blocks(note: Notification) -> list[dict[str, Any]]:
    icon = ":white_check_mark:" if note.status == "resolved" else _ICON.get(
        max(note.events, key=_rank).severity, ":bell:")
    out: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text",
                                    "text": fmt.cut_text(f"{icon} {fmt.title(note)}", MAX_HEADER_TEXT),
                                    "emoji": True}},
    ]
    used, shown = block_text(out), 0
    for event in note.events[:MAX_ALERTS_SHOWN]:
        more = _event_blocks(event)
        # Keep room for the summary line of what does not fit (at most ~600 characters).
        if used + block_text(more) > MAX_BLOCK_TEXT - 600:
            break
        out.extend(more)
        used += block_text(more)
        shown += 1
    if shown < len(note.events):
        out.append(_context(_summary(note.events[shown:])))
    return out


def _summary(rest: tuple[AlertEvent, ...]) -> str:
    counts: dict[str, int] = {}
    for e in rest:
        counts[e.alertname] = counts.get(e.alertname, 0) + 1
    names = ", ".join(f"{_escape(k)} x{v}" for k, v in sorted(counts.items(), key=lambda kv: -kv[1]))
    return f"and {len(rest)} more alerts of this run ({names})"[:500] + "; see /v1/alerts"


def block_text(blocks_: list[dict[str, Any]]) -> int:
    """Characters of text in blocks, as Slack counts them against a message."""
    total = 0
    stack: list[Any] = list(blocks_)
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            text = item.get("text")
            if isinstance(text, str):
                total += len(text)
            stack.extend(v for v in item.values() if isinstance(v, dict | list))
        elif isinstance(item, list):
            stack.extend(item)
    return total


def _rank(event: AlertEvent) -> int:
    return ("info", "warning", "error", "critical").index(event.severity) if event.severity in _ICON else 0


def _event_blocks(e: AlertEvent) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = [
        {"type": "section", "text": {"type": "mrkdwn", "text": _section_text(e)}}]
    facts = [f"severity *{e.severity}*", f"{e.count} finding{'s' if e.count != 1 else ''}"]
    if e.project:
        facts.insert(0, f"project *{_escape(e.project)}*")
    if e.acked_by:
        facts.append(f"acknowledged by {_escape(e.acked_by)}")
    out.append(_context(" · ".join(facts)))
    if e.dashboard_url and len(e.dashboard_url) <= MAX_SECTION_TEXT:  # a cut URL is no link
        out.append({"type": "actions", "elements": [{
            "type": "button", "text": {"type": "plain_text", "text": "Open in Grafana"},
            "url": e.dashboard_url,
        }]})
    out.append({"type": "divider"})
    return out


def _section_text(e: AlertEvent) -> str:
    """The alert's section: what, where, the measured value and what to try, in at most
    ``MAX_SECTION_TEXT`` characters; the summary (and then what to try) is what is cut."""
    status = {"resolved": "Resolved: ", "acknowledged": "Acknowledged: "}.get(e.status, "")
    lead = f"*{status}{_escape(e.alertname)}*: "
    rest = [f"*Where:* {_escape(fmt.where(e))}"]
    if (value := fmt.value_line(e)) is not None:
        rest.append(f"*Measured:* {value}")
    if e.status == "firing" and e.suggestions:
        rest.append("*What to try:*")
        rest.extend(f"• {_escape(s)}" for s in e.suggestions[:3])
    tail = fmt.cut_text("\n" + "\n".join(rest), MAX_SECTION_TEXT // 2)
    room = MAX_SECTION_TEXT - len(lead) - len(tail)
    return fmt.cut_text(lead + fmt.cut_text(_escape(e.summary), room) + tail, MAX_SECTION_TEXT)


def _context(text: str) -> dict[str, Any]:
    return {"type": "context", "elements": [{"type": "mrkdwn",
                                             "text": fmt.cut_text(text, MAX_SECTION_TEXT)}]}


def _escape(text: str) -> str:
    # Slack's mrkdwn gives &, < and > control meaning (links, mentions).
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
