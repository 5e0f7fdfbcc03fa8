"""A record is acknowledged only once what it causes is durable (issue 12).

alerts.sqlite is locked by another process's exclusive transaction, a real way for a
commit to fail (as a full disk does): the NaN record is stored, its alert is not. The
sidecar must answer 503 with Retry-After and turn not-ready; once the lock is gone, the
client's retry (answered "duplicate") still ends in a page, because the run is analysed
again from the store.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer
from tests.receivers import Receiver

PD_KEY = "0123456789abcdef0123456789abcdef"
RULES = """
routes: {page: [pagerduty]}
rules:
  - name: NaNLoss
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
"""


def _batch(steps, nan_at: int) -> dict:
    return {"records": [{"kind": "step", "run_id": "dur", "step": s, "time": 1000.0 + s,
                         "loss": "NaN" if s == nan_at else 1.0} for s in steps]}


def test_a_page_survives_an_alert_store_that_cannot_commit(tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    with Receiver("pagerduty") as pd:
        settings = load_settings(data_dir=tmp_path / "data", tick_interval_seconds=0.1, alerting={
            "rules_file": rules, "group_wait_seconds": 0.05,
            "pagerduty": {"routing_key": PD_KEY, "url": pd.url + "/v2/enqueue"}})
        with LiveServer(settings) as srv:
            url = srv.url + "/v1/records"
            assert httpx.post(url, json=_batch(range(1, 11), -1)).status_code == 200
            lock = sqlite3.connect(tmp_path / "data" / "alerts.sqlite", isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")
            try:
                batch = _batch(range(11, 14), nan_at=12)
                r = httpx.post(url, json=batch, timeout=60)
                assert r.status_code == 503, r.text
                assert int(r.headers["retry-after"]) > 0
                ready = httpx.get(srv.url + "/readyz")
                assert ready.status_code == 503 and "storage" in ready.json()["reason"]
                assert pd.requests == []
            finally:
                lock.execute("ROLLBACK")
                lock.close()
            # The client retries what was not acknowledged: every record is a duplicate,
            # and still the NaN is paged.
            again = httpx.post(url, json=batch, timeout=60)
            assert again.status_code in (200, 503), again.text
            if again.status_code == 503:  # readiness not restored by a tick yet
                eventually(lambda: httpx.get(srv.url + "/readyz").status_code == 200,
                           timeout=20, what="ready again")
                again = httpx.post(url, json=batch, timeout=60)
            assert again.status_code == 200 and again.json()["duplicates"] == 3
            pages = pd.wait_for(1, timeout=20, accepted_only=True)
            assert pages[0].json["event_action"] == "trigger"
            assert pages[0].json["payload"]["custom_details"]["step"] == 12
            eventually(lambda: httpx.get(srv.url + "/readyz").status_code == 200,
                       timeout=20, what="ready again")


def test_a_page_stored_but_not_alerted_is_paged_after_a_crash(tmp_path: Path):
    """No retry at all: the sidecar is killed while alerts.sqlite cannot commit, and the
    next start analyses the stored record again and pages."""
    from tests.sidecar_process import SidecarProcess

    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    with Receiver("pagerduty") as pd:
        config = tmp_path / "c.yaml"
        # Ticks and snapshots keep going while alerts cannot commit: a snapshot must not
        # cover the record whose alert was lost.
        config.write_text("tick_interval_seconds: 0.2\nsnapshot_interval_seconds: 0.2\n"
                          f"alerting:\n  rules_file: {rules}\n"
                          f"  group_wait_seconds: 0.05\n"
                          f"  pagerduty: {{routing_key: {PD_KEY}, url: '{pd.url}/v2/enqueue'}}\n")
        sc = SidecarProcess(tmp_path / "data", config=config).start()
        try:
            assert sc.post(_batch(range(1, 11), -1)["records"]).status_code == 200
            lock = sqlite3.connect(tmp_path / "data" / "alerts.sqlite", isolation_level=None)
            lock.execute("BEGIN EXCLUSIVE")
            r = httpx.post(sc.url + "/v1/records", json=_batch(range(11, 14), nan_at=12),
                           timeout=60)
            assert r.status_code == 503, r.text
            time.sleep(1.0)  # the store stays locked a while: the page must wait it out
            sc.kill()
            lock.execute("ROLLBACK")
            lock.close()
            assert pd.requests == []
            sc.start()
            pages = pd.wait_for(1, timeout=20, accepted_only=True)
            assert pages[0].json["payload"]["custom_details"]["step"] == 12
        finally:
            sc.stop()


def test_a_nan_step_at_time_1e308_is_refused_naming_time_and_the_real_one_paged(
        tmp_path: Path):
    """Building the dashboard link from ``time: 1e308`` overflowed after the records were
    committed: 500, the retry a duplicate, and no page ever. A record's time is bounded
    against its arrival now (records/limits.py ``MAX_CLOCK_AHEAD_SECONDS``): 1e308 is a 422
    naming ``time`` and stores nothing; the step with a real time is paged, with its link."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    with Receiver("pagerduty") as pd:
        settings = load_settings(data_dir=tmp_path / "data", alerting={
            "rules_file": rules, "group_wait_seconds": 0.05, "grafana_url": "http://grafana:3000",
            "pagerduty": {"routing_key": PD_KEY, "url": pd.url + "/v2/enqueue"}})
        with LiveServer(settings) as srv:
            url = srv.url + "/v1/records"
            assert httpx.post(url, json=_batch(range(1, 11), -1)).status_code == 200
            nan = {"kind": "step", "run_id": "dur", "step": 11, "time": 1e308, "loss": "NaN"}
            r = httpx.post(url, json={"records": [nan]}, timeout=60)
            assert r.status_code == 422 and "time: 1e+308 is" in r.text, r.text
            r = httpx.post(url, json={"records": [{**nan, "time": 1011.0}]}, timeout=60)
            assert r.status_code == 200 and r.json()["accepted"] == 1, r.text
            [page] = pd.wait_for(1, timeout=20, accepted_only=True)
            assert page.json["payload"]["custom_details"]["step"] == 11
            assert "var-run=dur" in page.json["client_url"]
            [alert] = httpx.get(srv.url + "/v1/alerts").json()["alerts"]
            assert alert["delivery"]["pagerduty"]["state"] == "sent"
