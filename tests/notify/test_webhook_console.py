"""The generic webhook body and the console channel."""

from __future__ import annotations

import json
import logging

import httpx

from monitor_agent.notify.console import ConsoleNotifier
from monitor_agent.notify.webhook import WebhookNotifier
from tests.notify.sample_events import event, note


def test_webhook_body_keeps_nan_as_valid_json():
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(json.loads(request.content))  # strict JSON: a bare NaN would fail here
        return httpx.Response(204)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert WebhookNotifier("http://hook/x?token=s3cret").send(note(), client).kind.value == "ok"
    body = sent[0]
    assert (body["version"], body["status"], body["groupKey"]) == ("1", "firing", "gpt-7")
    assert body["alerts"][0]["value"] == "NaN" and body["alerts"][0]["step"] == 300
    assert "s3cret" not in repr(WebhookNotifier("http://hook/x?token=s3cret"))


def test_console_logs_a_readable_message(caplog):
    caplog.set_level(logging.INFO, logger="monitor_agent.alerts")
    ConsoleNotifier().send(note(event(), event("firing", alertname="TrainingLossSpike")), None)
    assert "[FIRING:2] run gpt-7: TrainingNanInf, TrainingLossSpike" in caplog.text
    assert "try: lower the lr" in caplog.text
    assert caplog.records[0].levelno == logging.WARNING
