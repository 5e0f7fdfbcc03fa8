"""Alertmanager /api/v2/alerts payloads, and HA: ok when any member accepted."""

from __future__ import annotations

import json

import httpx

from monitor_agent.notify.alertmanager import AlertmanagerNotifier
from monitor_agent.notify.base import OutcomeKind
from tests.notify.sample_events import T0, event, note


def test_labels_are_the_stable_identity_and_the_rest_is_annotations():
    am = AlertmanagerNotifier(["http://am:9093"], refresh_interval=60)
    [alert] = am.payload(note(event(identity={"layer": "blocks.0.attn"})))
    assert alert["labels"] == {"alertname": "TrainingNanInf", "run_id": "gpt-7", "project": "gpt",
                               "severity": "critical", "source": "monitor-agent",
                               "team": "nlp", "layer": "blocks.0.attn"}
    notes = alert["annotations"]
    assert notes["suggestion"] == "lower the lr" and notes["step"] == "300"
    assert alert["startsAt"] == "2023-11-14T22:13:20Z"
    assert alert["endsAt"] == "2023-11-14T22:17:20Z"  # created + 4 resend intervals
    assert alert["generatorURL"].startswith("http://grafana")


def test_resolve_ends_now():
    [alert] = AlertmanagerNotifier(["http://am"]).payload(note(event("resolved", ends_at=T0 + 5)))
    assert alert["endsAt"] == "2023-11-14T22:13:25Z"


def test_one_accepting_member_is_enough():
    hosts = []

    def handler(request: httpx.Request) -> httpx.Response:
        hosts.append(request.url.host)
        assert request.url.path == "/api/v2/alerts"
        assert json.loads(request.content)[0]["labels"]["alertname"]
        return httpx.Response(503 if request.url.host == "am-0" else 200)

    am = AlertmanagerNotifier(["http://am-0:9093", "http://am-1:9093/"])
    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        assert am.send(note(), client).kind is OutcomeKind.OK
        assert hosts == ["am-0", "am-1"]
        both_down = AlertmanagerNotifier(["http://am-0:9093"])
        assert both_down.send(note(), client).kind is OutcomeKind.RETRY


def _real_am(tmp_path):
    import pytest

    from tests.alertmanager_process import AlertmanagerProcess, available

    if not available():
        pytest.skip("prometheus-alertmanager is not installed")
    return AlertmanagerProcess(tmp_path, webhook_url="http://127.0.0.1:9/unused")


def test_one_invalid_alert_does_not_fail_the_valid_ones(tmp_path):
    """Alertmanager 400s a batch with one invalid alert after storing the valid ones: the
    valid ones count as delivered, the invalid one is named."""
    import time

    now = time.time()
    good = event(fingerprint="good", alertname="GoodAlert", started_at=now - 10)
    bad = event("resolved", fingerprint="bad", alertname="BadAlert", started_at=now - 10,
                ends_at=now - 3600)  # ends before it started: Alertmanager refuses it
    with _real_am(tmp_path) as am, httpx.Client() as client:
        outcome = AlertmanagerNotifier([am.url]).send(note(good, bad), client)
        stored = httpx.get(am.url + "/api/v2/alerts").json()
    assert outcome.kind is OutcomeKind.OK, outcome
    assert "1/2 alerts accepted" in outcome.detail and "BadAlert" in outcome.detail
    assert [a["labels"]["alertname"] for a in stored] == ["GoodAlert"]


def test_ends_at_is_computed_when_sent_not_when_queued(tmp_path):
    """A notification queued an hour ago (an outage) still arrives firing."""
    import time

    from monitor_agent.notify.base import Notification

    now = time.time()
    late = Notification("gpt-7", (event(started_at=now - 3700),), created_at=now - 3600)
    with _real_am(tmp_path) as am, httpx.Client() as client:
        outcome = AlertmanagerNotifier([am.url], refresh_interval=60).send(late, client)
        (stored,) = httpx.get(am.url + "/api/v2/alerts").json()
    assert outcome.kind is OutcomeKind.OK
    assert stored["status"]["state"] == "active"
