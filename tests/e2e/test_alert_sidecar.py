"""Through the real sidecar: a NaN step pages Slack and PagerDuty receivers; after a kill -9
mid-incident nothing is paged twice and the resolve still arrives."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.eventually import eventually
from tests.receivers import Receiver

KEY = "e2e-routing-key-0123456789abcdef"
RULES = """
routes: {page: [pagerduty, slack]}
rules:
  - name: TrainingNanInf
    match: {types: [nan_inf]}
    severity: critical
    resolve_after: 3s
    fingerprint: []
"""


def _config(tmp: Path, slack: Receiver, pd: Receiver) -> Path:
    rules = tmp / "rules.yaml"
    rules.write_text(RULES)
    config = tmp / "config.yaml"
    config.write_text(
        "tick_interval_seconds: 0.2\n"
        "alerting:\n"
        f"  rules_file: {rules}\n"
        "  group_wait_seconds: 0.05\n"
        "  grafana_url: http://grafana.test:3000\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/e2esecret', min_interval_seconds: 0}}\n"
        f"  pagerduty: {{routing_key: {KEY}, url: '{pd.url}/v2/enqueue'}}\n"
    )
    return config


def _steps(start: int, stop: int, nan_from: int) -> list[dict]:
    return [{"kind": "step", "run_id": "gpt-e2e", "step": s, "time": 1000.0 + s,
             "loss": "NaN" if s >= nan_from else 2.0, "grad_norm": 1.0}
            for s in range(start, stop)]


def _wait_confirmed(url: str) -> None:
    sent = 'monitor_agent_notifications_total{channel="pagerduty",outcome="sent"} 1.0'
    eventually(lambda: sent in httpx.get(url + "/metrics").text, what="the page confirmed")


def _actions(pd: Receiver) -> list[str]:
    return [r.json["event_action"] for r in pd.accepted()]


@pytest.mark.slow
def test_page_survives_a_crash_without_duplicates_and_resolves(tmp_path, sidecar_factory):
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        sc = sidecar_factory(config=_config(tmp_path, slack, pd))
        sc.start()
        run = {"kind": "run", "run_id": "gpt-e2e", "labels": {"project": "e2e"}}
        assert sc.post([run, *_steps(1, 7, nan_from=6)]).status_code == 200
        [page] = pd.wait_for(1, accepted_only=True)
        assert page.json["payload"]["severity"] == "critical"
        assert "step 6" in page.json["payload"]["summary"]
        slack.wait_for(1, accepted_only=True)

        _wait_confirmed(sc.url)  # the sidecar knows the page went out (else at-least-once
        sc.kill()  # re-sends it, harmless under PagerDuty's dedup_key); now crash mid-incident
        sc.start()
        # The client re-sends what it was unsure of, and the run keeps producing NaN.
        assert sc.post([run, *_steps(1, 9, nan_from=6)]).status_code == 200

        eventually(lambda: "resolve" in _actions(pd), timeout=20, what="the resolve")
        assert _actions(pd) == ["trigger", "resolve"]
        slack.wait_for(2, timeout=10, accepted_only=True)  # its own sender thread: may lag
        assert [r.json["text"][:12] for r in slack.accepted()] == ["[FIRING:1] r", "[RESOLVED:1]"]
        assert pd.accepted()[1].json["dedup_key"] == page.json["dedup_key"]
        log = sc.log()
        assert KEY not in log and "e2esecret" not in log
