"""Alerting is the engine's AlertSink: same methods, same signatures, and it works as one."""

from __future__ import annotations

import inspect
from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting, AlertingSettings, RunContext
from monitor_agent.alerting.sink import AlertSink, NullSink
from monitor_agent.records.types import Finding, Severity

SINK_METHODS = ("handle", "preview", "run_ended", "tick", "attempt_settled")


def test_alerting_and_null_sink_have_the_protocols_signatures():
    for name in SINK_METHODS:
        want = inspect.signature(getattr(AlertSink, name))
        assert inspect.signature(getattr(Alerting, name)) == want, name
        assert inspect.signature(getattr(NullSink, name)) == want, name


def test_alerting_used_through_the_sink_seam(tmp_path: Path):
    settings = AlertingSettings(console={"enabled": False}, group_wait_seconds=0)
    alerting = Alerting(settings, tmp_path / "alerts.sqlite", CollectorRegistry(),
                        clock=lambda: 1e9)
    sink: AlertSink = alerting  # as serving/app.py hands it to the Engine (mypy checks that one)
    nan = Finding(type="nan_inf", severity=Severity.CRITICAL, run_id="r1", step=3,
                  message="loss is NaN", value=float("nan"))
    assert sink.handle(RunContext("r1"), [nan], now=1e9) == []
    sink.tick(1e9)
    [alert] = alerting.active_alerts()
    assert (alert.run_id, alert.type, alert.state, alert.last_step) == (
        "r1", "nan_inf", "firing", 3)
    sink.run_ended("r1", "completed", now=1e9 + 1)
    assert alerting.active_alerts() == []
