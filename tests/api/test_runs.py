"""GET /v1/runs and /v1/runs/{id} over real HTTP: a run answers the same fields whether it
is in memory or not (issue 24, item 9)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from live_server import LiveServer
from monitor_agent.records import wire
from monitor_agent.settings import load_settings


def test_a_run_that_left_memory_answers_like_a_live_one(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, ended_run_ttl_seconds=1.0)
    steps = [{"kind": "step", "run_id": "ttl", "step": s, "time": 100.0 + s,
              "loss": float("nan") if s == 7 else 2.0} for s in range(1, 13)]
    end = {"kind": "end", "run_id": "ttl", "step": 12, "time": 120.0}
    with LiveServer(settings) as srv:
        r = httpx.post(srv.url + "/v1/records", timeout=10,
                       content=b"\n".join(wire.dumps(x) for x in [*steps, end]),
                       headers={"Content-Type": "application/x-ndjson"})
        assert r.status_code == 200 and r.json()["accepted"] == 13, r.text
        [live] = httpx.get(srv.url + "/v1/runs", timeout=10).json()["runs"]
        live_detail = httpx.get(srv.url + "/v1/runs/ttl", timeout=10).json()
        assert live["active"] and live["last_step"] == 12 and live["findings"] >= 1
        deadline = time.monotonic() + 30
        while True:
            [stored] = httpx.get(srv.url + "/v1/runs", timeout=10).json()["runs"]
            if not stored["active"] or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        detail = httpx.get(srv.url + "/v1/runs/ttl", timeout=10).json()
    assert not stored["active"], "the run never left memory"
    assert {k: v for k, v in stored.items() if k != "active"} == {
        k: v for k, v in live.items() if k != "active"}
    assert detail["last_step"] == live_detail["last_step"] == 12
    assert detail["attempts"] == live_detail["attempts"]
    assert detail["findings"] == live_detail["findings"]


def test_findings_of_replaced_steps_stay_stored_and_leave_the_current_view(tmp_path: Path):
    def steps(token: str, first: int, last: int, nan_at: int) -> list[dict]:
        return [{"kind": "step", "run_id": "re", "step": s, "time": 1.0 + s, "attempt": token,
                 "loss": float("nan") if s == nan_at else 2.0} for s in range(first, last + 1)]

    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        for batch in (steps("a", 1, 40, nan_at=30), steps("b", 25, 50, nan_at=-1)):
            r = httpx.post(srv.url + "/v1/records", timeout=10,
                           content=b"\n".join(wire.dumps(x) for x in batch),
                           headers={"Content-Type": "application/x-ndjson"})
            assert r.json()["accepted"] == len(batch), r.text
        every = httpx.get(f"{srv.url}/v1/runs/re/findings", timeout=10).json()["findings"]
        current = httpx.get(f"{srv.url}/v1/runs/re/findings", params={"current": "true"},
                            timeout=10).json()["findings"]
    assert [(f["type"], f["step"], f["attempt"]) for f in every] == [("nan_inf", 30, 1)]
    assert current == []
