"""A full disk: the sidecar says not-ready and answers 503 instead of acknowledging."""

from __future__ import annotations

from pathlib import Path

import httpx

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer


def _batch(start: int) -> dict:
    blob = {f"layer{i}": {"grad_norm": 1.0, "param_norm": 1.0} for i in range(200)}
    return {"records": [{"kind": "step", "run_id": "full", "step": s, "time": float(s),
                         "loss": 1.0, "layers": blob} for s in range(start, start + 20)]}


def test_full_disk_means_503_and_not_ready(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, max_db_bytes=1 << 20, tick_interval_seconds=60)
    with LiveServer(settings) as srv:
        accepted, status, step = 0, 200, 1
        while status == 200 and step < 5000:
            r = httpx.post(srv.url + "/v1/records", json=_batch(step), timeout=10)
            status = r.status_code
            if status == 200:
                accepted += r.json()["accepted"]
            step += 20
        assert status == 503, r.text
        assert "retry" in r.json()["detail"]
        ready = httpx.get(srv.url + "/readyz")
        assert ready.status_code == 503 and "storage" in ready.json()["reason"]
        stored = httpx.get(srv.url + "/v1/runs/full/records", params={"limit": 10000}).json()
        # Everything acknowledged is stored; nothing unacknowledged is.
        assert len(stored["records"]) == accepted
        # A client retry of what it already sent and has been acknowledged is no problem;
        # new records keep getting 503 (not a lie of an acknowledgement).
        again = httpx.post(srv.url + "/v1/records", json=_batch(step + 100), timeout=10)
        assert again.status_code == 503
