"""Secrets a receiver echoes back never reach a log line or a stored error (issue 12).

A Slack receiver that answers 404 ``Cannot POST /services/T000/B000/<secret>`` (as an
Express server does) and a debug-level sidecar process: the secret path must appear
neither in the sidecar's log (whatever logger wrote it) nor in ``outbox.last_error``.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx

from monitor_agent.notify.redact import MASK, SecretRedactor
from receivers import Receiver, Reply
from sidecar_process import SidecarProcess

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
            deadline = time.monotonic() + 10
            errors: list = []
            while time.monotonic() < deadline and not errors:
                errors = db.execute("SELECT last_error FROM outbox WHERE state = 'failed'"
                                    ).fetchall()
                time.sleep(0.1)
            db.close()
            time.sleep(0.3)
            log = sc.log()
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
