"""Slack Block Kit payloads: what happened, where, the numbers, what to try, the link."""

from __future__ import annotations

import json

import httpx

from monitor_agent.notify.base import OutcomeKind
from monitor_agent.notify.slack import MAX_BLOCK_TEXT, SlackNotifier, block_text
from tests.notify.sample_events import event, note

URL = "https://hooks.slack.test/services/T0/B0/XYZ"


def test_firing_message_has_fallback_text_and_blocks():
    payload = SlackNotifier(URL).payload(note(event()))
    assert payload["text"].startswith("[FIRING:1] run gpt-7: TrainingNanInf")
    header, section, context, actions, divider = payload["blocks"]
    assert header["type"] == "header" and ":red_circle:" in header["text"]["text"]
    text = section["text"]["text"]
    for part in ("run gpt-7, step 300, layer blocks.0.attn", "value NaN (judged against 2.31)",
                 "• lower the lr", "&lt;at&gt;", "&amp;"):
        assert part in text
    assert "project *gpt*" in context["elements"][0]["text"]
    assert actions["elements"][0]["url"].endswith("var-run=gpt-7")
    assert divider == {"type": "divider"}


def test_resolved_message_says_so_without_suggestions():
    payload = SlackNotifier(URL).payload(note(event("resolved")))
    assert payload["text"].startswith("[RESOLVED:1]")
    assert ":white_check_mark:" in payload["blocks"][0]["text"]["text"]
    assert "lower the lr" not in json.dumps(payload["blocks"])


def test_many_alerts_stay_within_slack_limits():
    events = [event(fingerprint=str(i), summary="x" * 5000) for i in range(30)]
    payload = SlackNotifier(URL).payload(note(*events))
    assert len(payload["blocks"]) <= 50
    assert all(len(b.get("text", {}).get("text", "")) <= 3000 for b in payload["blocks"])
    assert block_text(payload["blocks"]) <= MAX_BLOCK_TEXT
    assert "more alerts of this run (TrainingNanInf x" in json.dumps(payload["blocks"][-1])
    assert len(payload["text"]) <= 3000


def test_send_posts_json_and_classifies():
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        return httpx.Response(400, text="invalid_payload")

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        outcome = SlackNotifier(URL).send(note(), client)
    assert outcome.kind is OutcomeKind.PERMANENT and "invalid_payload" in outcome.detail
    assert seen[0]["blocks"]
    assert "XYZ" not in repr(SlackNotifier(URL))
