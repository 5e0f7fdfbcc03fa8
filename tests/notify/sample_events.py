"""Notifications to feed channels in tests."""

from __future__ import annotations

from typing import Any

from monitor_agent.notify.base import AlertEvent, Notification

T0 = 1_700_000_000.0


def event(status: str = "firing", **kw: Any) -> AlertEvent:
    base: dict[str, Any] = dict(
        fingerprint="abc123", run_id="gpt-7", alertname="TrainingNanInf", type="nan_inf",
        severity="critical", status=status, summary="loss is NaN <at> step 300 & more",
        started_at=T0, project="gpt", step=300, layer="blocks.0.attn", rank=0,
        value=float("nan"), threshold=2.31, suggestions=("lower the lr", "check the batch"),
        evidence={"loss": float("nan"), "ema": 2.31}, labels={"team": "nlp", "bad-label": "x"},
        identity={}, count=3, dashboard_url="http://grafana:3000/d/monitor-agent-training-run/monitor-agent-training-run?var-run=gpt-7",
        ends_at=T0 + 60 if status == "resolved" else None,
    )
    base.update(kw)
    return AlertEvent(**base)


def note(*events: AlertEvent) -> Notification:
    return Notification("gpt-7", events or (event(),), T0)
