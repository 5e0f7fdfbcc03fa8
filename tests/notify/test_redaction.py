"""Secrets a receiver echoes back never reach a log line or a stored error (issue 12).

A Slack receiver that answers 404 ``Cannot POST /services/T000/B000/<secret>`` (as an
Express server does) and a debug-level sidecar process: the secret path must appear
neither in the sidecar's log (whatever logger wrote it) nor in ``outbox.last_error``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import httpx

from monitor_agent.notify.redact import MASK, SecretRedactor
from tests.eventually import eventually
from tests.receivers import Receiver, Reply
from tests.sidecar_process import SidecarProcess

SECRET = "XoXbSeCrEtHoOkPaTh9000"
TOKEN = "tok-0d9c8b7a6f5e4d3c"
RULES = """
routes: {page: [slack]}
rules:
  - name: NaNLoss
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
"""


def test_echoed_secret_path_is_redacted_in_logs_and_outbox(tmp_path: Path):
    (tmp_path / "rules.yaml").write_text(RULES)
    with Receiver("slack") as slack:
        path = f"/services/T000/B000/{SECRET}"
        slack.script(Reply(404, f"Cannot POST {path}"))
        config = tmp_path / "c.yaml"
        config.write_text(
            f"log_level: debug\ntoken: {TOKEN}\nalerting:\n"
            f"  rules_file: {tmp_path / 'rules.yaml'}\n  group_wait_seconds: 0.05\n"
            f"  slack: {{webhook_url: '{slack.url}{path}', min_interval_seconds: 0}}\n")
        with SidecarProcess(tmp_path / "data", config=config) as sc:
            steps = [{"kind": "step", "run_id": "leak", "step": s, "time": float(s),
                      "loss": "NaN" if s == 3 else 1.0} for s in range(1, 5)]
            r = httpx.post(sc.url + "/v1/records", json={"records": steps},
                           headers={"authorization": f"Bearer {TOKEN}"})
            assert r.status_code == 200
            slack.wait_for(1)
            db = sqlite3.connect(tmp_path / "data" / "alerts.sqlite")
            errors = eventually(lambda: db.execute(
                "SELECT last_error FROM outbox WHERE state = 'failed'").fetchall(),
                interval=0.1, what="the failed delivery stored")
            db.close()
            log = eventually(lambda: "Cannot POST" in (text := sc.log()) and text,
                             what="the failure logged")
    assert errors and "Cannot POST" in errors[0][0] and MASK in errors[0][0]
    assert SECRET not in errors[0][0]
    assert "Cannot POST" in log  # the failure is logged...
    assert SECRET not in log and TOKEN not in log  # ...without the secret


def test_redactor_masks_parts_of_url_secrets_in_any_logger(caplog):
    import logging

    url = f"https://hooks.example.com/services/T000/B000/{SECRET}?token=abcdefghijklmnop"
    redactor = SecretRedactor([url, None, ""])
    redactor.install()
    try:
        logging.getLogger("some.library").warning("failed %s", f"POST /services/T000/B000/{SECRET}")
        logging.getLogger("other").error("token was %s", "abcdefghijklmnop")
        try:
            raise RuntimeError(f"cannot reach {url}")
        except RuntimeError:
            logging.getLogger("x").exception("boom")
    finally:
        redactor.uninstall()
    text = caplog.text
    assert SECRET not in text and "abcdefghijklmnop" not in text
    assert text.count(MASK) >= 3
    logging.getLogger("after").warning("plain %s", SECRET)  # uninstalled: untouched
    assert SECRET in caplog.records[-1].getMessage()


PD_KEY = "R0uT1nGkEy4c9e2b7d1f0a3e5c6b8d9f"


def test_pagerduty_key_echoed_after_a_prefix_is_masked_in_log_outbox_and_api(tmp_path: Path):
    """A receiver quoting the key cut short (its last 20 of 32 characters) leaks nothing:
    not in the sidecar's log, ``outbox.last_error`` or ``GET /v1/alerts``."""
    tail = PD_KEY[12:]
    (tmp_path / "rules.yaml").write_text(RULES.replace("[slack]", "[pagerduty]"))
    with Receiver("pagerduty") as pd:
        pd.script(Reply(400, '{"status": "invalid event", "errors": '
                        f'["Invalid routing key: ...{tail} is not an integration"]}}'))
        config = tmp_path / "c.yaml"
        config.write_text(
            f"log_level: debug\nalerting:\n  rules_file: {tmp_path / 'rules.yaml'}\n"
            f"  group_wait_seconds: 0.05\n"
            f"  pagerduty: {{routing_key: {PD_KEY}, url: '{pd.url}/v2/enqueue'}}\n")
        with SidecarProcess(tmp_path / "data", config=config) as sc:
            steps = [{"kind": "step", "run_id": "pd", "step": s, "time": float(s),
                      "loss": "NaN" if s == 3 else 1.0} for s in range(1, 5)]
            assert httpx.post(sc.url + "/v1/records", json={"records": steps}).status_code == 200
            pd.wait_for(1)
            def failed() -> dict:
                alerts = httpx.get(sc.url + "/v1/alerts").json()["alerts"]
                delivery = alerts[0]["delivery"] if alerts else {}
                assert "failed" in str(delivery), delivery
                return delivery

            delivery = eventually(failed, interval=0.1, what="the delivery failed")
            db = sqlite3.connect(tmp_path / "data" / "alerts.sqlite")
            errors = [e for (e,) in db.execute("SELECT last_error FROM outbox")]
            db.close()
            log = sc.log()
    answer = str(delivery)
    assert "failed" in answer and "Invalid routing key" in answer and MASK in answer
    assert errors and all(e is None or tail[:8] not in e for e in errors)
    assert "Invalid routing key" in log
    for text in (answer, log, *[e or "" for e in errors]):
        # Not even a shorter piece of the key survives: every 8-character window is masked.
        assert not any(PD_KEY[i:i + 8] in text for i in range(len(PD_KEY) - 7)), text
