"""PagerDuty Events API v2 payloads: trigger, acknowledge, resolve with one dedup_key."""

from __future__ import annotations

from monitor_agent.notify.pagerduty import PagerDutyNotifier, dedup_key
from tests.notify.sample_events import event
from tests.receivers import pagerduty_errors

KEY = "0123456789abcdef0123456789abcdef"


def test_trigger_has_everything_a_responder_needs():
    body = PagerDutyNotifier(KEY, "http://pd").payload(event())
    assert pagerduty_errors(body) == []
    assert (body["event_action"], body["dedup_key"]) == ("trigger", dedup_key("abc123"))
    p = body["payload"]
    assert (p["severity"], p["source"], p["class"], p["component"], p["group"]) == (
        "critical", "monitor-agent/gpt-7", "nan_inf", "blocks.0.attn", "gpt")
    assert p["timestamp"] == "2023-11-14T22:13:20+00:00"
    assert p["custom_details"]["suggestions"] == ["lower the lr", "check the batch"]
    assert p["custom_details"]["evidence"] == {
        "finding": "the nan_inf finding at step 300, layer blocks.0.attn (3 findings in this alert)",
        "loss": "NaN", "ema": "2.31"}
    assert body["links"][0]["href"].endswith("var-run=gpt-7")


def test_resolve_and_acknowledge_reuse_the_dedup_key():
    pd = PagerDutyNotifier(KEY, "http://pd")
    for status, action in (("resolved", "resolve"), ("acknowledged", "acknowledge")):
        body = pd.payload(event(status))
        assert body == {"routing_key": KEY, "event_action": action, "dedup_key": dedup_key("abc123")}
        assert pagerduty_errors(body) == []


def test_severity_mapping_and_summary_limit():
    pd = PagerDutyNotifier(KEY, "http://pd")
    for sev in ("critical", "error", "warning", "info"):
        assert pd.payload(event(severity=sev))["payload"]["severity"] == sev
    assert len(pd.payload(event(summary="x" * 5000))["payload"]["summary"]) == 1024
    assert KEY not in repr(pd)
