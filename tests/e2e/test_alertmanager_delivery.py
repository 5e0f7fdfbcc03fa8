"""Our alerts through the real Alertmanager binary to a webhook receiver: fire, re-send,
resolve, and HA (one member down is fine)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting, AlertingSettings, RunContext
from monitor_agent.records.types import Finding, Severity
from tests.alertmanager_process import AlertmanagerProcess, available
from tests.eventually import eventually
from tests.receivers import Receiver
from tests.sidecar_process import free_port

pytestmark = [
    pytest.mark.binaries,
    pytest.mark.skipif(not available(), reason="prometheus-alertmanager not installed"),
]


def _wait(hook: Receiver, status: str, timeout: float = 20.0) -> dict:
    def notified() -> dict:
        found = [r.json for r in hook.requests if r.json and r.json.get("status") == status]
        assert found, [r.json for r in hook.requests]
        return found[0]

    return eventually(notified, timeout=timeout, what=f"a {status} notification")


def test_alertmanager_routes_our_alert_and_its_resolve(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text("routes: {page: [alertmanager]}\nrules:\n  - name: TrainingNanInf\n"
                     "    match: {types: [nan_inf]}\n    severity: critical\n"
                     "    resolve_after: 2s\n    fingerprint: [layer]\n")
    with Receiver("webhook") as hook, AlertmanagerProcess(tmp_path, hook.url + "/am") as am:
        dead = f"http://127.0.0.1:{free_port()}"  # an HA member that is down
        settings = AlertingSettings(rules_file=rules, group_wait_seconds=0,
                                    grafana_url="http://grafana:3000",
                                    alertmanager={"urls": [dead, am.url],
                                                  "resend_interval_seconds": 1})
        alerting = Alerting(settings, tmp_path / "alerts.sqlite", CollectorRegistry())
        alerting.start()
        try:
            finding = Finding(type="nan_inf", severity=Severity.CRITICAL, run_id="gpt-7",
                              step=300, message="loss is NaN", layer="blocks.0.attn",
                              suggestions=("lower the learning rate",))
            alerting.handle(RunContext("gpt-7", project="gpt", labels={"team": "nlp"}),
                            [finding], time.time())
            firing = _wait(hook, "firing")
            [alert] = firing["alerts"]
            assert alert["labels"] == {
                "alertname": "TrainingNanInf", "run_id": "gpt-7", "project": "gpt",
                "severity": "critical", "source": "monitor-agent", "team": "nlp",
                "layer": "blocks.0.attn"}
            assert alert["annotations"]["suggestion"] == "lower the learning rate"
            assert alert["generatorURL"].startswith("http://grafana:3000/d/monitor-agent-training-run/")
            for _ in range(4):  # the resolve comes from our tick, after 2 s clear
                time.sleep(1)
                alerting.tick(time.time())
            resolved = _wait(hook, "resolved")
            assert resolved["alerts"][0]["labels"]["run_id"] == "gpt-7"
            sent = alerting.metrics.notifications.labels(channel="alertmanager", outcome="sent")
            assert sent._value.get() >= 2  # the first send, re-sends while firing, the resolve
        finally:
            alerting.stop()
