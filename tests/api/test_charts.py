"""``/v1/runs/{id}/series`` over real HTTP: the sidecar folds what it ingests into the chart
history and answers it downsampled."""

from __future__ import annotations

import json
import math
from pathlib import Path

import httpx

from monitor_agent.settings import load_settings
from tests.chart_records import steps
from tests.eventually import eventually
from tests.live_server import LiveServer


def test_series_endpoint_reads_the_sidecar_history(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, token="t0k", auth_reads=True)
    auth = {"Authorization": "Bearer t0k"}
    body = "\n".join(json.dumps(r) for r in steps(300, {150: {"loss": 9.0}}))
    with LiveServer(settings) as srv:
        res = httpx.post(srv.url + "/v1/records", content=body, timeout=30,
                         headers={**auth, "content-type": "application/x-ndjson"})
        assert res.status_code == 200, res.text
        assert httpx.get(srv.url + "/v1/runs/r/series").status_code == 401  # auth_reads
        def indexed() -> dict:
            res = httpx.get(srv.url + "/v1/runs/r/series?points=30", headers=auth)
            assert res.status_code == 200 and res.json()["count"] == 300, res.text[:200]
            return res.json()

        out = eventually(indexed, timeout=20, interval=0.1, what="300 steps charted")
        assert out["count"] == 300 and len(out["steps"]) == 30 and out["bucketed"]
        assert max(out["series"]["loss"]["max"]) == 9.0
        assert out["warmup"] == 10 and out["total_steps"] == 300
        assert len(out["update_band"]["low"]) == 30
        assert out["update_limits"] == [1e-7, 0.1] and out["user_names"] == []
        zoom = httpx.get(srv.url + "/v1/runs/r/series?points=30&start=100&end=200",
                         headers=auth).json()
        assert zoom["range"] == [100, 200] and zoom["count"] == 101
        assert 100 <= zoom["steps"][0] < zoom["steps"][-1] <= 200
        bad = httpx.get(srv.url + "/v1/runs/r/series?points=1", headers=auth)
        assert bad.status_code == 422
        assert httpx.get(srv.url + "/v1/runs/nope/series", headers=auth).status_code == 404
        assert math.isfinite(out["series"]["loss"]["mean"][0])


def test_step_metrics_sent_over_http_come_back_in_the_series(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path)
    recs = steps(50, {s: {"metrics": {"accuracy": s / 50}} for s in range(1, 51)})
    with LiveServer(settings) as srv:
        res = httpx.post(srv.url + "/v1/records", json={"records": recs}, timeout=30)
        assert res.status_code == 200, res.text
        def indexed() -> dict:
            out = httpx.get(srv.url + "/v1/runs/r/series?points=100").json()
            assert out.get("count") == 50, out.get("count")
            return out

        out = eventually(indexed, timeout=20, interval=0.1, what="50 steps charted")
        assert out["user_names"] == ["accuracy"]
        assert out["user_scalars"]["accuracy"]["steps"] == list(range(1, 51))
        assert out["user_scalars"]["accuracy"]["mean"][-1] == 1.0
        bad = httpx.post(srv.url + "/v1/records", timeout=30, json={"records": [
            {"kind": "step", "run_id": "r", "step": 51, "time": 1.0, "metrics": {"a": "x"}}]})
        assert bad.status_code == 422 and "metrics" in bad.text
