"""The Alerting facade end to end: findings in, Slack and PagerDuty receivers out."""

from __future__ import annotations

import logging

import pytest

from alert_harness import ROUTING_KEY, Harness, nan, spike
from monitor_agent.notify.pagerduty import dedup_key
from tests.receivers import Reply


def test_a_storm_of_findings_is_one_alert_and_one_page(harness: Harness):
    harness.handle(*[nan(step=10, layer=f"l{i}") for i in range(20)])
    for step in range(11, 30):
        harness.handle(nan(step=step))
    harness.tick(1.0)
    harness.drain()
    assert len(harness.pd.requests) == 1 and len(harness.slack.requests) == 1
    event = harness.pd.requests[0].json
    assert event["event_action"] == "trigger"
    assert event["payload"]["severity"] == "critical"
    assert event["routing_key"] == ROUTING_KEY
    [alert] = harness.alerting.active_alerts()
    assert (alert.alertname, alert.state, alert.count, alert.last_step) == (
        "TrainingNanInf", "firing", 39, 29)
    assert event["dedup_key"] == dedup_key(alert.fingerprint)
    assert harness.decisions()["first"] == 1 and harness.decisions()["suppressed"] == 38


def test_alerts_of_one_run_are_grouped_into_one_slack_message(harness: Harness):
    # The spike first: one after the NaN page would follow from it (test_related.py).
    harness.handle(spike(), nan())
    harness.drain()
    assert len(harness.slack.requests) == 1
    text = harness.slack.requests[0].json["text"]
    assert "TrainingNanInf" in text and "TrainingLossSpike" in text
    # PagerDuty: one incident per alert, and only the page-worthy one.
    assert [r.json["payload"]["class"] for r in harness.pd.requests] == ["nan_inf"]


def test_group_wait_merges_findings_that_arrive_close_together(harness: Harness):
    harness.alerting.settings.group_wait_seconds = 0.5
    harness.handle(spike())
    harness.tick(0.2)
    harness.handle(nan(step=11))
    harness.tick(0.2)
    assert harness.alerting.outbox.pending == 0  # still waiting for the group
    harness.tick(0.2)
    harness.drain()
    assert len(harness.slack.requests) == 1
    assert "[FIRING:2]" in harness.slack.requests[0].json["text"]


def test_resolve_after_clear_time_sends_resolves(harness: Harness):
    harness.handle(nan())
    harness.drain()
    harness.tick(599)
    harness.drain()
    assert len(harness.pd.requests) == 1
    harness.tick(1)  # 600 s without a NaN finding: the default resolve_after
    harness.drain()
    trigger, resolve = (r.json for r in harness.pd.requests)
    assert resolve == {"routing_key": ROUTING_KEY, "event_action": "resolve",
                       "dedup_key": trigger["dedup_key"]}
    assert "RESOLVED" in harness.slack.requests[-1].json["text"]
    assert harness.alerting.list_alerts(state="resolved")[0].resolved_at == harness.clock()
    assert harness.alerting.active_alerts() == []


def test_repeat_while_firing_until_acknowledged(harness: Harness):
    harness.handle(nan(step=1))
    for i in range(2, 9):  # keep it firing: a NaN every 10 minutes minus a second
        harness.tick(599)
        harness.handle(nan(step=i))
    harness.tick(1)
    harness.drain()
    actions = [r.json["event_action"] for r in harness.pd.requests]
    assert actions == ["trigger", "trigger"]  # the first page and one reminder after 1 h
    fp = harness.alerting.active_alerts()[0].fingerprint
    view = harness.alerting.acknowledge(fp, by="ana")
    assert view.acked_by == "ana"
    for i in range(9, 17):
        harness.tick(598)
        harness.handle(nan(step=i))
    harness.drain()
    actions = [r.json["event_action"] for r in harness.pd.requests]
    assert actions == ["trigger", "trigger", "acknowledge"]


def test_refire_after_the_cooldown_pages_again(harness: Harness):
    harness.handle(spike(step=1))
    harness.tick(300)  # loss spike: resolve_after 5m
    harness.drain()
    assert [m.json["text"][:10] for m in harness.slack.requests] == ["[FIRING:1]", "[RESOLVED:"]
    harness.handle(spike(step=2))  # 300 s after the first page: cooldown (300 s) elapsed
    harness.tick(0)
    harness.drain()
    assert len(harness.slack.requests) == 3
    harness.tick(300)  # resolves again
    harness.tick(1)
    harness.handle(spike(step=3))  # 301 s after the last page... cooldown over again
    harness.drain()
    assert len(harness.slack.requests) == 5


def test_cooldown_holds_a_quick_refire(harness: Harness, tmp_path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("routes: {chat: [slack]}\nrules:\n  - name: Spike\n"
                     "    match: {types: [loss_spike]}\n    cooldown: 10m\n    resolve_after: 1m\n")
    harness.settings.rules_file = rules
    harness.restart()
    harness.handle(spike(step=1))
    harness.tick(60)
    harness.drain()
    assert len(harness.slack.requests) == 2  # fired, resolved
    harness.handle(spike(step=2))  # flapping back 60 s after the page
    for step in range(3, 13):  # and staying: a spike every 50 s until 560 s after the page
        harness.tick(50)
        harness.handle(spike(step=step))
    harness.drain()
    assert len(harness.slack.requests) == 2
    assert harness.decisions()["cooldown"] == 1
    assert harness.alerting.active_alerts()[0].state == "firing"
    harness.tick(50)  # 610 s: the cooldown is over and it still fires
    harness.drain()
    assert len(harness.slack.requests) == 3
    assert harness.slack.requests[-1].json["text"].startswith("[FIRING:1]")


def test_silence_mutes_then_releases(harness: Harness):
    silence = harness.alerting.add_silence(run_id="r1", type="nan_inf", duration=120,
                                           created_by="ana", comment="known")
    harness.handle(nan(step=1))
    harness.tick(1)
    harness.drain()
    assert harness.pd.requests == [] and harness.slack.requests == []
    assert [a.silenced for a in harness.alerting.list_alerts(state="silenced")] == [True]
    assert harness.decisions()["silenced"] == 1
    harness.handle(spike(run_id="r1"), run="r1")  # other type: not silenced
    harness.drain()
    assert len(harness.slack.requests) == 1
    assert harness.alerting.expire_silence(silence.id)
    assert not harness.alerting.expire_silence(silence.id)
    harness.tick(1)
    harness.drain()
    assert [r.json["event_action"] for r in harness.pd.requests] == ["trigger"]


def test_log_only_and_unmatched_findings_are_never_sent(harness: Harness):
    from monitor_agent.records.types import Finding, Severity

    quiet = Finding(type="nan_inf", severity=Severity.CRITICAL, run_id="r1", step=1,
                    message="m", log_only=True)
    info = Finding(type="plateau2", severity=Severity.INFO, run_id="r1", step=1, message="m")
    harness.handle(quiet, info)
    harness.tick(1)
    harness.drain()
    assert harness.alerting.list_alerts() == []
    assert harness.decisions()["log_only"] == 1 and harness.decisions()["unmatched"] == 1


def test_completed_run_resolves_its_alerts(harness: Harness):
    harness.handle(spike())
    harness.drain()
    harness.alerting.run_ended("r1", "completed", harness.clock.advance(5))
    harness.drain()
    assert harness.slack.requests[-1].json["text"].startswith("[RESOLVED:1]")
    harness.alerting.run_ended("r1", "failed", harness.clock())  # nothing left to resolve


def test_failed_run_keeps_its_page_open(harness: Harness):
    harness.handle(nan())
    harness.alerting.run_ended("r1", "failed", harness.clock.advance(1))
    harness.drain()
    assert [r.json["event_action"] for r in harness.pd.requests] == ["trigger"]


def test_restart_mid_incident_no_duplicate_page_and_resolve_still_arrives(harness: Harness):
    harness.handle(nan(step=5))
    harness.drain()
    harness.restart()
    # Recovery replays the stored tail: the same findings come again, then new ones.
    harness.handle(nan(step=5))
    harness.handle(nan(step=6))
    harness.tick(1)
    harness.drain()
    assert [r.json["event_action"] for r in harness.pd.requests] == ["trigger"]
    harness.restart()
    harness.tick(600)
    harness.drain()
    assert [r.json["event_action"] for r in harness.pd.requests] == ["trigger", "resolve"]


def test_pending_work_survives_a_restart(harness: Harness):
    harness.alerting.settings.group_wait_seconds = 30
    harness.handle(nan())  # pending: the group is still gathering
    harness.restart()
    harness.tick(31)
    harness.drain()
    assert [r.json["event_action"] for r in harness.pd.requests] == ["trigger"]


def test_secrets_stay_out_of_logs_repr_and_dumps(harness: Harness, caplog: pytest.LogCaptureFixture):
    harness.pd.script(*[Reply(500)] * 3)
    caplog.set_level(logging.DEBUG)
    harness.handle(nan())
    harness.drain(advance=True)
    text = caplog.text + repr(harness.alerting.notifiers) + repr(harness.settings)
    text += str(harness.settings.model_dump(mode="json"))
    assert ROUTING_KEY not in text and "/services/T0/B0/secret" not in text
    assert "retry" in caplog.text  # the failures were logged, without the secret


def test_views_carry_what_the_exposition_shows(harness: Harness):
    harness.handle(nan(layer="blocks.0.attn"))
    harness.drain()
    [view] = harness.alerting.alerts_for_run("r1")
    assert (view.severity, view.summary, view.suggestion, view.project) == (
        "critical", "loss is NaN", "lower the learning rate", "proj")
    assert view.dashboard_url.startswith(
        "http://grafana.test:3000/d/monitor-agent-training-run/monitor-agent-training-run?var-run=r1&from=")
    assert harness.alerting.acknowledge("nope", by="x") is None


def test_every_series_exists_from_the_first_scrape(harness: Harness):
    from prometheus_client import generate_latest

    text = generate_latest(harness.registry).decode()
    for line in ('monitor_agent_notifications_total{channel="pagerduty",outcome="failed"} 0.0',
                 'monitor_agent_alert_decisions_total{reason="cooldown"} 0.0',
                 "monitor_agent_outbox_pending 0.0",
                 'monitor_agent_notification_duration_seconds_count{channel="slack"} 0.0'):
        assert line in text


def test_an_alert_that_cannot_be_worded_holds_back_only_its_own_run(harness: Harness):
    """A stored finding that no longer parses (damaged, or written by another version)
    made every flush fail, so no run was paged again; now only that run waits."""
    harness.alerting.stop()  # nothing flushes while the damage is made
    harness.handle(nan(run_id="bad"), run="bad")
    with harness.alerting.db.tx() as conn:
        conn.execute("UPDATE alerts SET finding = ? WHERE run_id = 'bad'", (b"{not json",))
    harness.handle(nan(run_id="good"), run="good")
    harness.alerting.start()
    pages = harness.pd.wait_for(1, accepted_only=True)
    assert [p.json["payload"]["custom_details"]["run_id"] for p in pages] == ["good"]
    assert [a.state for a in harness.alerting.store.alerts(run_id="bad")] == ["pending"]
