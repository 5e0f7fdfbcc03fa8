"""``GET /v1/runs/{run_id}/goodput`` over real HTTP: records of known timing posted raw to
a live sidecar (a 2-rank run with a loader stall, a checkpoint save, an eval, a hang its
watchdog reported, a crash and a relaunch from the checkpoint, a straggler) come back as
exactly those costs, adding up to the wall-clock time, and survive a sidecar restart."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

T0 = 10_000.0


def _run(t: float, token: str) -> list[dict[str, Any]]:
    return [{"kind": "run", "run_id": "gp", "rank": r, "time": t, "attempt": token,
             "hardware": {"world_size": 2, "device": "cuda"}} for r in (0, 1)]


def _step(step: int, t: float, token: str, data: float = 0.0) -> list[dict[str, Any]]:
    # Rank 1 waits 0.25 s more than rank 0 at every all-reduce: rank 0 is the slow one.
    return [{"kind": "step", "run_id": "gp", "rank": r, "step": step, "time": t,
             "attempt": token, "loss": 2.0, "grad_norm": 1.0, "step_time": 1.0 + data,
             "data_time": data, "sync_wait_time": 0.05 + 0.25 * r} for r in (0, 1)]


def _post(srv: LiveServer, records: list[dict[str, Any]]) -> None:
    r = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=10)
    assert r.status_code == 200, r.text
    assert not r.json().get("rejected"), r.json()


def _goodput(srv: LiveServer) -> dict[str, Any]:
    r = httpx.get(srv.url + "/v1/runs/gp/goodput", timeout=10)
    r.raise_for_status()
    return r.json()


def _attempt_one(srv: LiveServer) -> float:
    """Up 3 s before step 1 (steps take 1 s); step 5 waits 4 s more on its loader; a 2 s
    save after step 10 and a 1.5 s eval after step 12; no step after 15 for 20 s, which the
    watchdog reports 10 s in; the process dies after step 20 (its end record says failed)."""
    t = T0
    _post(srv, _run(t, "a"))
    for step in range(1, 21):
        wait = 4.0 if step == 5 else 0.0
        t += 1.0 + wait + {1: 3.0, 11: 2.0, 13: 1.5, 16: 20.0}.get(step, 0.0)
        _post(srv, _step(step, t, "a", data=wait))
        if step == 10:
            _post(srv, [{"kind": "checkpoint", "run_id": "gp", "step": 10, "time": t + 2.0,
                         "attempt": "a", "path": "/c/10.pt", "seconds": 2.0}])
        if step == 12:
            _post(srv, [{"kind": "eval", "run_id": "gp", "step": 12, "time": t + 1.5,
                         "attempt": "a", "val_loss": 2.1, "seconds": 1.5}])
        if step == 15:
            _post(srv, [{"kind": "hang", "run_id": "gp", "step": 15, "time": t + 11.0,
                         "attempt": "a", "stuck_seconds": 11.0, "limit_seconds": 10.0}])
    _post(srv, [{"kind": "end", "run_id": "gp", "step": 20, "time": t, "attempt": "a",
                 "status": "failed", "error": "RuntimeError: boom"}])
    return t


def test_each_injected_cost_is_its_own_bucket_and_they_add_up(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as server:
        before = _costs(server)
    # The ledger is kept: a restarted sidecar says the same.
    with LiveServer(load_settings(data_dir=tmp_path)) as server:
        assert _goodput(server) == before


def _costs(srv: LiveServer) -> dict[str, Any]:
    assert httpx.get(srv.url + "/v1/runs/nope/goodput").status_code == 404
    t = _attempt_one(srv)
    g = _goodput(srv)
    bad = g["badput_seconds"]
    assert g["gpus"] == 2
    assert bad["startup"] == pytest.approx(3.0)
    assert bad["input"] == pytest.approx(4.0)
    assert bad["checkpoint"] == pytest.approx(2.0)
    assert bad["eval"] == pytest.approx(1.5)
    # Step 16 should have ended at +1 s; the watchdog said so 10 s later; it came at +21 s.
    assert bad["hang_undetected"] == pytest.approx(10.0)
    assert bad["hang_detected"] == pytest.approx(10.0)
    # Rank 1 waited 0.25 s a step more than rank 0 over 20 steps: the other rank's wait
    # less the straggler's is all of that from the second step on (the first is start-up),
    # and rank 0 spent it on its own compute (its step less its data and its wait is 0.25 s
    # longer than rank 1's).
    assert bad["straggler_compute"] == pytest.approx(19 * 0.25)
    assert g["straggler"]["rank"] == 0
    assert g["straggler"]["parts"]["compute"] == pytest.approx(4.75)
    assert g["wall_seconds"] == pytest.approx(t - T0)
    assert g["productive_seconds"] + g["badput_seconds_total"] == pytest.approx(
        g["wall_seconds"])
    [hang] = [i for i in g["incidents"] if i["kind"] == "hang"]
    assert hang["seconds"] == pytest.approx(20.0) and not hang["open"]
    assert "20 s x 2 GPUs" in hang["words"]
    # /metrics says the same once the engine's tick reported the ledger.
    labels = 'project="",run_id="gp"'
    want = {f'training_badput_seconds_total{{{labels},cause="input"}} 4.0',
            f'training_badput_seconds_total{{{labels},cause="hang_detected"}} 10.0',
            f"training_run_gpus{{{labels}}} 2.0",
            f"training_run_wall_seconds{{{labels}}} {t - T0!r}"}
    def exposed() -> list[str]:
        lines = httpx.get(srv.url + "/metrics").text.splitlines()
        assert want <= set(lines), sorted(want - set(lines))
        return lines

    lines = eventually(exposed, interval=0.2, what="the goodput series on /metrics")
    [ratio] = [ln for ln in lines if ln.startswith("training_goodput_ratio{")]
    assert float(ratio.split()[-1]) == pytest.approx(g["goodput_ratio"])
    # Who the straggler is, and what it spent the tax on, for the dashboards.
    tax = {ln.split("{")[1].split("}")[0]: float(ln.split()[-1]) for ln in lines
           if ln.startswith("training_straggler_badput_seconds{")}
    who = 'rank="0",node=""'
    assert tax == {f'{labels},cause="straggler_data",{who}': 0.0,
                   f'{labels},cause="straggler_compute",{who}': pytest.approx(4.75),
                   f'{labels},cause="straggler_collective",{who}': 0.0}

    # Relaunched 30 s after the crash, from the checkpoint at step 10: steps 11-20 are done
    # again (their productive time is discarded work), and the new process is up 2 s
    # before its first step.
    t2 = t + 30.0
    _post(srv, _run(t2, "b"))
    t2 += 3.0
    _post(srv, _step(11, t2, "b"))
    for step in range(12, 25):
        t2 += 1.0
        _post(srv, _step(step, t2, "b"))
    g = _goodput(srv)
    bad = g["badput_seconds"]
    assert bad["restart"] == pytest.approx(30.0)
    assert bad["startup"] == pytest.approx(3.0 + 2.0)
    # Steps 11-20 of the first attempt: ten 1 s steps, less the straggler's share.
    assert bad["resume"] == pytest.approx(10.0, abs=0.05)
    [restart] = [i for i in g["incidents"] if i["kind"] == "restart"]
    assert restart["step"] == 11
    assert restart["detail"]["gap"] == pytest.approx(30.0)
    assert restart["seconds"] == pytest.approx(30.0 + 2.0 + 10.0, abs=0.05)
    assert [a["attempt"] for a in g["attempts"]] == [1, 2]
    assert g["productive_seconds"] + g["badput_seconds_total"] == pytest.approx(
        g["wall_seconds"])
    assert g["wall_seconds"] == pytest.approx(t2 - T0)
    return g
