"""Client clocks jumping an hour, out-of-order and duplicate steps, a re-sent spool after a
restart: stored once, and not a single false finding or alert."""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer
from tests.sidecar_process import SidecarProcess
from tests.ticks import ticked

HOUR = 3600.0


def _healthy(run: str, steps: range, t0: float, jump_at: int | None = None,
             jump: float = 0.0) -> list[dict]:
    rng = random.Random(1)
    recs = []
    for s in steps:
        t = t0 + 0.1 * s + (jump if jump_at is not None and s >= jump_at else 0.0)
        recs.append({"kind": "step", "run_id": run, "step": s, "time": t,
                     "loss": 3.0 * math.exp(-s / 400) + rng.gauss(0, 0.01),
                     "grad_norm": 1.0 + rng.gauss(0, 0.02), "lr": 1e-3, "step_time": 0.1,
                     "tokens": 1000, "tokens_per_second": 10_000.0 + rng.gauss(0, 50)})
    return recs


def _post(url: str, recs: list[dict]) -> dict:
    r = httpx.post(url + "/v1/records", json={"records": recs}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _no_findings(url: str, run: str) -> None:
    found = httpx.get(f"{url}/v1/runs/{run}/findings").json()["findings"]
    assert found == [], found
    assert httpx.get(url + "/v1/alerts").json()["alerts"] == []


def _stored_steps(url: str, run: str) -> list[int]:
    recs = httpx.get(f"{url}/v1/runs/{run}/records", params={"limit": 10_000}).json()["records"]
    return [r["step"] for r in recs if r["kind"] == "step"]


@pytest.fixture
def server(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, tick_interval_seconds=0.05)) as srv:
        yield srv


@pytest.mark.parametrize("jump", [-HOUR, HOUR], ids=["back-an-hour", "forward-an-hour"])
def test_client_clock_jump_raises_no_alert(server, jump):
    now = time.time()
    for start in range(1, 301, 30):  # batches as the client sends them, ticks in between
        _post(server.url, _healthy("jumpy", range(start, start + 30), now, 150, jump))
        time.sleep(0.05)  # wall time passes between batches, as in a real run
    ticked(server.url)  # the stall check runs on every tick, on the run's own clock
    _no_findings(server.url, "jumpy")
    assert _stored_steps(server.url, "jumpy") == list(range(1, 301))


def test_out_of_order_and_duplicate_steps_raise_no_alert(server):
    recs = _healthy("shuffled", range(1, 301), time.time())
    batches = [recs[i:i + 25] for i in range(0, 300, 25)]
    rng = random.Random(3)
    for batch in batches:
        rng.shuffle(batch)  # reordered within a batch
    rng.shuffle(batches[4:8])  # and whole batches arriving late
    late = 0
    for batch in batches + batches[2:6]:  # then a retry storm re-sends old batches
        late += _post(server.url, batch)["late"]
        time.sleep(0.02)  # batches spread in time, as a retry storm's
    ticked(server.url)  # a finding would be made now
    assert late > 0
    _no_findings(server.url, "shuffled")
    assert _stored_steps(server.url, "shuffled") == list(range(1, 301))


@pytest.mark.slow
def test_resent_spool_after_restart_raises_no_alert(tmp_path: Path):
    sc = SidecarProcess(tmp_path / "data", env={"MONITOR_AGENT_TICK_INTERVAL_SECONDS": "0.1"})
    sc.start()
    try:
        recs = _healthy("respool", range(1, 201), time.time())
        _post(sc.url, recs[:120])
        sc.kill()
        sc.start()
        # The client did not know which of its last batches arrived: it re-sends its spool.
        answer = _post(sc.url, recs[60:200])
        assert answer["duplicates"] == 60 and answer["accepted"] == 80
        ticked(sc.url)  # a finding from the re-sent records would be made now
        _no_findings(sc.url, "respool")
        assert _stored_steps(sc.url, "respool") == list(range(1, 201))
    finally:
        sc.stop()
