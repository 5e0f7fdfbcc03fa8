"""Which channels are active: with none configured, alerts reach the console, and a real
``monitor-agent serve`` says so in one startup line."""

from __future__ import annotations

from monitor_agent.alerting.settings import AlertingSettings
from monitor_agent.notify.channels import build_notifiers, describe_channels
from tests.eventually import eventually


def test_console_is_the_fallback_when_nothing_is_configured():
    s = AlertingSettings()
    notifiers = build_notifiers(s)
    assert list(notifiers) == ["console"]
    assert "fallback" in describe_channels(s, notifiers)


def test_a_configured_channel_replaces_the_fallback_and_false_means_off():
    s = AlertingSettings(webhook={"url": "http://127.0.0.1:1/hook"})
    assert list(build_notifiers(s)) == ["webhook"]
    assert describe_channels(s, build_notifiers(s)) == "alert channels: webhook"
    both = AlertingSettings(webhook={"url": "http://127.0.0.1:1/hook"}, console={"enabled": True})
    assert list(build_notifiers(both)) == ["webhook", "console"]
    off = AlertingSettings(console={"enabled": False})
    assert build_notifiers(off) == {}
    assert "none" in describe_channels(off, {})


def test_a_bare_sidecar_prints_its_alerts_and_names_its_channels(sidecar):
    log = sidecar.log()
    assert "alert channels: console (fallback: no other channel is configured" in log
    steps = [{"kind": "step", "run_id": "fresh", "step": s, "time": 1000.0 + s,
              "loss": "NaN" if s >= 5 else 2.0, "grad_norm": 1.0} for s in range(1, 7)]
    assert sidecar.post([{"kind": "run", "run_id": "fresh"}, *steps]).status_code == 200
    eventually(lambda: "[FIRING" in sidecar.log(), timeout=15, what="the console page",
               context=sidecar.log)
    assert "TrainingNanInf" in sidecar.log() and "run fresh" in sidecar.log()
