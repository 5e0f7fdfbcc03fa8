"""A full run with a token, a Slack webhook URL and a PagerDuty routing key configured, debug
logging, failing then healthy receivers, bad tokens and bad records; then every output is
grepped for the secrets: the sidecar's log, every /v1 answer, /metrics, the OpenAPI
document and check-config's output."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.eventually import eventually
from tests.receivers import Receiver, Reply
from tests.sidecar_process import REPO, SidecarProcess

TOKEN = "tok-7f3a9e21c4b8d5e6"
SLACK_SECRET = "XoXbSeCrEtHoOkPaTh42"
PD_KEY = "R0UT1NGKEYf00dfeed99000000000000"


def _config(tmp: Path, slack: Receiver, pd: Receiver) -> Path:
    config = tmp / "secret.yaml"
    config.write_text(
        f"token: {TOKEN}\nlog_level: debug\ntick_interval_seconds: 0.1\n"
        "alerting:\n  group_wait_seconds: 0.05\n"
        f"  slack: {{webhook_url: '{slack.url}/services/T0/B0/{SLACK_SECRET}', "
        "min_interval_seconds: 0, timeout_seconds: 0.5}\n"
        f"  pagerduty: {{routing_key: {PD_KEY}, url: '{pd.url}/v2/enqueue', "
        "timeout_seconds: 0.5}\n"
    )
    return config


def _exercise(sc: SidecarProcess, slack: Receiver, pd: Receiver) -> list[str]:
    """Drive a run that pages through failures; return every HTTP answer's text."""
    auth = {"authorization": f"Bearer {TOKEN}"}
    slack.script(Reply(500, "server_error"), Reply(429, "rate_limited", retry_after=0.2),
                 Reply(200, delay=1.0), Reply(404, "no_service"))
    pd.script(Reply(500, {"status": "error"}), Reply(202, delay=1.0))
    steps = [{"kind": "step", "run_id": "leak", "step": s, "time": 1000.0 + s,
              "loss": "NaN" if s >= 6 else 2.0, "grad_norm": 1.0} for s in range(1, 9)]
    run = {"kind": "run", "run_id": "leak", "labels": {"project": "p"}, "config": {"lr": 1}}
    texts = []
    for headers in (auth, {}, {"authorization": "Bearer " + TOKEN[:-1]}):
        texts.append(httpx.post(sc.url + "/v1/records", json={"records": [run, *steps]},
                                headers=headers, timeout=10).text)
    texts.append(httpx.post(sc.url + "/v1/records", json={"records": [{"kind": "step"}]},
                            headers=auth).text)
    pd.wait_for(3, timeout=30)
    texts.append(httpx.post(sc.url + "/v1/records", headers=auth, json={"records": [
        {"kind": "end", "run_id": "leak", "step": 9, "time": 1010.0, "status": "completed"}]}).text)
    # What the end sets off (the resolves, their log lines) is searched too: the page's
    # resolve has reached PagerDuty.
    eventually(lambda: [r for r in pd.requests if r.json.get("event_action") == "resolve"],
               timeout=30, what="the end's resolve at PagerDuty")
    return texts


def _every_get(url: str) -> list[str]:
    doc = httpx.get(url + "/openapi.json").json()
    alerts = httpx.get(url + "/v1/alerts").json()["alerts"]
    fingerprint = alerts[0]["fingerprint"] if alerts else "x"
    texts = [httpx.get(url + "/openapi.json").text, httpx.get(url + "/metrics").text]
    for path, ops in doc["paths"].items():
        if "get" in ops:
            filled = path.replace("{run_id}", "leak").replace("{fingerprint}", fingerprint)
            filled = re.sub(r"\{[^}]+\}", "1", filled)
            texts.append(httpx.get(url + filled, params={"limit": 1000}).text)
    return texts


@pytest.mark.slow
def test_no_secret_in_any_output(tmp_path: Path):
    with Receiver("slack") as slack, Receiver("pagerduty") as pd:
        config = _config(tmp_path, slack, pd)
        sc = SidecarProcess(tmp_path / "data", config=config).start()
        try:
            outputs = _exercise(sc, slack, pd) + _every_get(sc.url)
        finally:
            sc.stop()
        assert any(r.json and r.json.get("routing_key") == PD_KEY for r in pd.accepted())
        assert slack.accepted()  # the secrets were really in use
    check = subprocess.run([sys.executable, "-m", "monitor_agent", "check-config", str(config)],
                           capture_output=True, text=True, cwd=REPO, timeout=60)
    assert check.returncode == 0, check.stderr
    log = sc.log()
    assert "DEBUG" in log and "delivery failed" in log  # debug logging and failures happened
    everything = {"log": log, "check-config": check.stdout + check.stderr,
                  **{f"answer {i}": t for i, t in enumerate(outputs)}}
    for where, text in everything.items():
        for secret in (TOKEN, SLACK_SECRET, PD_KEY):
            assert secret not in text, f"{secret!r} leaked into {where}"
