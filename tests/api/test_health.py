"""Health, readiness and the exposition format (checked by the real promtool)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from monitor_agent.records import wire
from monitor_agent.settings import load_settings
from tests.live_server import LiveServer


def test_health_and_ready(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        assert httpx.get(srv.url + "/healthz").json() == {"status": "ok"}
        assert httpx.get(srv.url + "/readyz").json() == {"status": "ready"}
        assert httpx.get(srv.url + "/docs").status_code == 200
        spec = httpx.get(srv.url + "/openapi.json").json()
        assert "/v1/records" in spec["paths"]


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed")
def test_metrics_pass_promtool_check_metrics(tmp_path: Path, traces_dir: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        for name in ("straggler_ddp_gpt.jsonl.gz", "nan_batch_cnn.jsonl.gz"):
            lines = b"\n".join(wire.dumps(o) for o in wire.iter_trace(traces_dir / name))
            r = httpx.post(srv.url + "/v1/records", content=lines, timeout=30,
                           headers={"content-type": "application/x-ndjson"})
            assert r.status_code == 200, r.text
        text = httpx.get(srv.url + "/metrics").content
    assert b'rank="1"' in text and b"training_layer_grad_norm" in text
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True)
    assert proc.returncode == 0, proc.stdout.decode() + proc.stderr.decode()
