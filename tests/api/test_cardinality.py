"""Cardinality caps: new runs beyond max_active_runs are refused with a reason, and
/metrics stays within its caps with the drops counted."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer


def test_too_many_active_runs_get_429_with_a_reason(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, max_active_runs=20, max_runs_exposed=10)
    with LiveServer(settings) as srv:
        recs = [{"kind": "step", "run_id": f"bomb-{i}", "step": 1, "time": 1.0, "loss": 1.0}
                for i in range(60)]
        r = httpx.post(srv.url + "/v1/records", json={"records": recs}, timeout=30)
        assert r.status_code == 200
        body = r.json()
        assert body["accepted"] == 20 and len(body["rejected"]) == 40
        assert "max_active_runs" in body["rejected"][0]["reason"]
        only_new = httpx.post(srv.url + "/v1/records", timeout=30, json={"records": [
            {"kind": "step", "run_id": "one-more", "step": 1, "time": 1.0}]})
        assert only_new.status_code == 429
        # Known runs keep flowing.
        known = httpx.post(srv.url + "/v1/records", timeout=30, json={"records": [
            {"kind": "step", "run_id": "bomb-0", "step": 2, "time": 2.0, "loss": 1.0}]})
        assert known.status_code == 200 and known.json()["accepted"] == 1
        text = httpx.get(srv.url + "/metrics").text
        assert len(set(re.findall(r'run_id="([^"]+)"', text))) == 10
        dropped = re.search(r'monitor_agent_dropped_series_total\{reason="max_runs"\} (\S+)', text)
        assert dropped and float(dropped.group(1)) >= 10


def test_layer_bomb_is_capped_on_metrics(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, max_layers_exposed=100)
    with LiveServer(settings) as srv:
        layers = {f"layer.{i}": {"grad_norm": 1.0} for i in range(5000)}
        rec = {"kind": "step", "run_id": "wide", "step": 1, "time": 1.0, "layers": layers}
        assert httpx.post(srv.url + "/v1/records", json={"records": [rec]},
                          timeout=30).status_code == 200
        text = httpx.get(srv.url + "/metrics").text
        assert text.count("training_layer_grad_norm{") == 100
        m = re.search(r'monitor_agent_dropped_series_total\{reason="max_layers"\} (\S+)', text)
        assert m and float(m.group(1)) >= 4900
