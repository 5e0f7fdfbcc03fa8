"""Pages a Slack receiver refuses are not lost silently (issue 12), over real HTTP.

The local Slack receiver refuses what Slack refuses (more than 50 blocks, more than
~12,000 characters of block text: ``msg_blocks_too_long``) and can be scripted to answer
400 ``invalid_blocks``.
"""

from __future__ import annotations

from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from monitor_agent.notify.base import OutcomeKind
from monitor_agent.notify.slack import SlackNotifier
from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer
from tests.notify.sample_events import event, note
from tests.receivers import Receiver, Reply

RULES = """
routes: {page: [slack]}
rules:
  - name: NaNLoss
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
"""


def test_forty_grouped_alerts_fit_one_message_slack_accepts():
    events = [event(fingerprint=f"f{i}", alertname=f"Alert{i % 7}",
                    summary="loss went NaN in a layer with a long explanation " * 12,
                    suggestions=("lower the learning rate " * 10,) * 3) for i in range(40)]
    with Receiver("slack") as slack, httpx.Client() as client:
        outcome = SlackNotifier(slack.url + "/services/T/B/X").send(note(*events), client)
        assert outcome.kind is OutcomeKind.OK, outcome
        (got,) = slack.accepted()
    text = str(got.json["blocks"][-1])
    assert "more alerts of this run" in text and "see /v1/alerts" in text


def test_a_refused_layout_is_sent_again_as_plain_text():
    with Receiver("slack") as slack, httpx.Client() as client:
        slack.script(Reply(400, "invalid_blocks"))
        outcome = SlackNotifier(slack.url + "/services/T/B/X").send(note(), client)
        assert outcome.kind is OutcomeKind.OK and "plain text" in outcome.detail
        first, second = slack.requests
    assert first.status == 400 and "blocks" in first.json
    assert second.status == 200 and "blocks" not in second.json
    assert second.json["text"].startswith("[FIRING:1] run gpt-7")


def _metric(text: str, name: str, **labels: str) -> float:
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def test_an_undelivered_page_is_visible_in_api_metric_and_log(tmp_path: Path, caplog):
    (tmp_path / "rules.yaml").write_text(RULES)
    with Receiver("slack") as slack:
        slack.script(Reply(400, "invalid_blocks"), Reply(400, "invalid_payload"))
        settings = load_settings(data_dir=tmp_path / "d", alerting={
            "rules_file": tmp_path / "rules.yaml", "group_wait_seconds": 0.05,
            "slack": {"webhook_url": slack.url + "/services/T/B/X", "min_interval_seconds": 0}})
        with LiveServer(settings) as srv:
            steps = [{"kind": "step", "run_id": "lost", "step": s, "time": float(s),
                      "loss": "NaN" if s == 2 else 1.0} for s in range(1, 4)]
            assert httpx.post(srv.url + "/v1/records", json={"records": steps}).status_code == 200
            slack.wait_for(2)
            def failed() -> dict:
                alerts = httpx.get(srv.url + "/v1/alerts").json()["alerts"]
                delivery = alerts[0]["delivery"].get("slack", {}) if alerts else {}
                assert delivery.get("state") == "failed", delivery
                return delivery

            delivery = eventually(failed, what="the Slack delivery failed")
            metrics = httpx.get(srv.url + "/metrics").text
    assert delivery["state"] == "failed" and "invalid_payload" in delivery["last_error"]
    assert _metric(metrics, "monitor_agent_notifications_undelivered_total",
                   channel="slack", reason="http_400") == 1
    errors = [r for r in caplog.records if r.levelname == "ERROR" and "NOT DELIVERED" in r.getMessage()]
    assert errors and "slack" in errors[0].getMessage()
