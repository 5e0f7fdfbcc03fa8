"""``GET /v1/runs/{run_id}/checkpoints`` over real HTTP: checkpoint records posted raw to a
live sidecar are judged clean or suspect, named on /metrics and in pages, and bad ones are
refused with the field named, changing nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer


def _step(step: int, loss: float | str = 2.0, rank: int = 0, run: str = "led") -> dict[str, Any]:
    return {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": 100.0 + step,
            "loss": loss, "grad_norm": 1.0}


def _ckpt(step: int, path: str | None = None, run: str = "led", **kw: Any) -> dict[str, Any]:
    return {"kind": "checkpoint", "run_id": run, "step": step, "time": 100.0 + step,
            "path": path or f"/ckpt/step-{step}.pt", **kw}


@pytest.fixture
def server(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        yield srv


def _post(srv: LiveServer, records: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=10)


def _ledger(srv: LiveServer, run: str = "led") -> dict[str, Any]:
    r = httpx.get(f"{srv.url}/v1/runs/{run}/checkpoints", timeout=10)
    r.raise_for_status()
    return r.json()


def test_checkpoints_are_judged_clean_or_suspect_and_the_last_clean_one_named(server):
    assert httpx.get(server.url + "/v1/runs/nope/checkpoints").status_code == 404
    _post(server, [_step(s) for s in range(1, 11)] + [_ckpt(10, bytes=123, tag="periodic")])
    _post(server, [_step(s) for s in range(11, 21)] + [_ckpt(20)])
    ledger = _ledger(server)
    assert [(c["step"], c["status"]) for c in ledger["checkpoints"]] == [
        (10, "clean"), (20, "clean")]
    assert (ledger["checkpoints"][0]["bytes"], ledger["checkpoints"][0]["tag"]) == (
        123, "periodic")
    assert ledger["last_clean"] == {"step": 20, "path": "/ckpt/step-20.pt"}
    # The loss goes NaN at 21 and stays so: a save at 22 holds damaged weights.
    _post(server, [_step(21, "NaN"), _step(22, "NaN"), _ckpt(22)])
    ledger = _ledger(server)
    [*_, last] = ledger["checkpoints"]
    assert (last["step"], last["status"]) == (22, "suspect")
    assert "nan_inf from step 21" in last["reason"]
    assert ledger["last_clean"] == {"step": 20, "path": "/ckpt/step-20.pt"}
    metrics = httpx.get(server.url + "/metrics").text
    assert 'training_last_clean_checkpoint_step{project="",run_id="led"} 20' in metrics
    # The alert about the NaN, and so its pages, name the safe save.
    [alert] = httpx.get(server.url + "/v1/alerts").json()["alerts"]
    assert (alert["type"], alert["checkpoint"]) == (
        "nan_inf", "last clean checkpoint: step 20, /ckpt/step-20.pt")


def test_bad_checkpoints_are_refused_naming_the_field_and_change_nothing(server):
    _post(server, [_step(s, rank=r) for s in range(1, 11) for r in (0, 1)] + [_ckpt(10)])
    before = _ledger(server)

    huge = _post(server, [_ckpt(9, path="/ckpt/" + "x" * (1 << 20))])
    assert huge.status_code == 422 and "path" in huge.json()["detail"]
    assert "exceed the budget of 4096" in huge.json()["detail"]
    nul = _post(server, [_ckpt(9, path="/ckpt/a\x00b")])
    assert nul.status_code == 422 and "path" in nul.json()["detail"]

    future = _post(server, [_ckpt(500)])
    assert future.status_code == 422
    assert "in the future" in future.json()["detail"] and "latest step" in future.json()["detail"]
    # The checkpoint right after its step record, in the same batch, is no future one.
    ok = _post(server, [_step(11), _ckpt(11)]).json()
    assert (ok["accepted"], ok["rejected"]) == (2, [])

    other = _post(server, [_ckpt(10, path="/elsewhere/step-10.pt")])
    assert other.status_code == 422
    assert "path" in other.json()["detail"] and "already has a checkpoint at step 10" in \
        other.json()["detail"]
    mixed = _post(server, [_ckpt(10, path="/a.pt"), _ckpt(10)]).json()  # one bad, one retried
    assert mixed["accepted"] == 0 and mixed["duplicates"] == 1
    assert [r["index"] for r in mixed["rejected"]] == [0]
    same = _post(server, [_ckpt(10)]).json()
    assert (same["accepted"], same["duplicates"]) == (0, 1)

    after = _ledger(server)
    assert [c["step"] for c in after["checkpoints"]] == [10, 11]
    assert after["checkpoints"][0] == before["checkpoints"][0]
    records = httpx.get(server.url + "/v1/runs/led/records",
                        params={"kind": "checkpoint", "limit": 100}).json()["records"]
    assert [(r["step"], r["path"]) for r in records] == [
        (10, "/ckpt/step-10.pt"), (11, "/ckpt/step-11.pt")]


def test_a_checkpoint_a_restart_replaced_leaves_the_ledger(server):
    _post(server, [{**_step(s), "attempt": "a"} for s in range(1, 31)]
          + [_ckpt(30, attempt="a"), {"kind": "end", "run_id": "led", "step": 30,
                                      "time": 1100.0, "attempt": "a"}])
    assert _ledger(server)["last_clean"]["step"] == 30
    # The run id is used again from step 1: attempt "a"'s history, its save included, is
    # no longer the run's; nothing of it may be rolled back to.
    _post(server, [{**_step(s), "attempt": "b"} for s in range(1, 6)])
    assert _ledger(server) == {"run_id": "led", "checkpoints": [], "last_clean": None,
                               "next": None}
    metrics = httpx.get(server.url + "/metrics").text
    assert "training_last_clean_checkpoint_step{" not in metrics


# -- issue 35: the ledger is read a page at a time, or thinned for a chart -----------------

LONG = "/ckpt/" + "d" * 3000  # ~3 KB a checkpoint: 35 of them exceed the smallest page


def _walk(srv: LiveServer, path: str) -> list[dict[str, Any]]:
    pages = []
    while path is not None:
        r = httpx.get(srv.url + path, timeout=10)
        assert r.status_code == 200, r.text
        pages.append(r.json())
        path = pages[-1]["next"]
    return pages


def test_the_ledger_is_read_a_page_at_a_time_within_the_read_budget(tmp_path: Path):
    page_bytes = 64 * 1024  # the smallest read_page_bytes
    with LiveServer(load_settings(data_dir=tmp_path, read_page_bytes=page_bytes)) as srv:
        _post(srv, [_step(s) for s in range(1, 61)]
              + [_ckpt(s, path=f"{LONG}/step-{s}.pt") for s in range(2, 61, 2)])
        _post(srv, [_step(s, "NaN") for s in range(61, 71)]
              + [_ckpt(s, path=f"{LONG}/step-{s}.pt") for s in range(62, 71, 2)])
        # The default page holds what read_page_bytes allows (plus the one that crosses
        # it), then links to the rest: one GET never carries the whole ledger.
        first = httpx.get(srv.url + "/v1/runs/led/checkpoints", timeout=10)
        body = first.json()
        assert body["next"] is not None and len(body["checkpoints"]) < 35
        assert len(first.content) < page_bytes + 8 * 1024
        pages = _walk(srv, "/v1/runs/led/checkpoints?limit=7")
        thinned = httpx.get(srv.url + "/v1/runs/led/checkpoints?points=4", timeout=10).json()
        ranged = httpx.get(srv.url + "/v1/runs/led/checkpoints?points=100&start=20&end=30",
                           timeout=10).json()
        bad = httpx.get(srv.url + "/v1/runs/led/checkpoints?after=12:step", timeout=10)
        missing = httpx.get(srv.url + "/v1/runs/nope/checkpoints?points=4", timeout=10)
    ledger = [c for page in pages for c in page["checkpoints"]]
    assert all(len(page["checkpoints"]) <= 7 for page in pages) and len(pages) == 6
    assert [(c["step"], c["status"]) for c in ledger] == (
        [(s, "clean") for s in range(2, 61, 2)] + [(s, "suspect") for s in range(62, 71, 2)])
    assert {tuple(p["last_clean"].items()) for p in pages} == {
        (("step", 60), ("path", f"{LONG}/step-60.pt"))}
    assert ledger[:len(body["checkpoints"])] == body["checkpoints"]
    # Thinned: at most 4 (and the last clean one), each standing for the others of its
    # quarter of the range; the last clean and a suspect one are among them.
    marks = thinned["checkpoints"]
    assert thinned["next"] is None and len(marks) <= 5
    assert sum(1 + c["also"] for c in marks) == 35
    assert {(c["step"], c["status"]) for c in marks} >= {(60, "clean"), (62, "suspect")}
    assert [c["step"] for c in ranged["checkpoints"]] == list(range(20, 31, 2))
    assert bad.status_code == 422 and "after" in bad.text
    assert missing.status_code == 404
