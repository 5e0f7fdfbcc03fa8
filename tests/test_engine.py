"""Engine housekeeping on a live sidecar: retention runs a slice per tick and keeps the
newest ``retention_steps`` steps of every run and rank; evals and other kinds stay."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from live_server import LiveServer
from monitor_agent.settings import load_settings


def _stored_steps(url: str, run: str, rank: int = 0) -> list[int]:
    body = httpx.get(f"{url}/v1/runs/{run}/records", params={"limit": 10_000}).json()
    return [r["step"] for r in body["records"] if r["kind"] == "step" and r["rank"] == rank]


def test_retention_keeps_the_newest_steps_of_every_rank(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, retention_steps=100, tick_interval_seconds=0.05)
    with LiveServer(settings) as srv:
        for run in ("a", "b"):
            records = [{"kind": "step", "run_id": run, "step": s, "rank": rank,
                        "time": 1000.0 + s, "loss": 1.0}
                       for s in range(1, 201) for rank in (0, 1)]
            records.append({"kind": "eval", "run_id": run, "step": 10, "time": 1010.5,
                            "val_loss": 1.0})
            assert httpx.post(srv.url + "/v1/records", json={"records": records}).is_success
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(_stored_steps(srv.url, "b", 1)) > 100:
            time.sleep(0.05)
        for run in ("a", "b"):
            for rank in (0, 1):
                assert _stored_steps(srv.url, run, rank) == list(range(101, 201))
        evals = httpx.get(f"{srv.url}/v1/runs/a/records", params={"kind": "eval"}).json()
        assert [r["step"] for r in evals["records"]] == [10]
