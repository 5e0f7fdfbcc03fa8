"""``/v1/runs`` over real HTTP: ``/records`` and ``/findings`` pages bounded by ``limit``
and ``read_page_bytes``, each ending in a ``next`` link that reads on without a gap or a
repeat, however the pages fall across a step's ranks; and a run answering the same fields
whether it is in memory or not."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from monitor_agent.records import wire
from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

RANKS, STEPS, LAYERS = 3, 12, 60
PAGE_BYTES = 64 * 1024   # the smallest read_page_bytes


def _step(rank: int, step: int, loss: float | str = 1.0) -> dict:
    return {"kind": "step", "run_id": "r", "rank": rank, "step": step, "time": float(step),
            "loss": loss, "layers": {f"blocks.{i}.mlp.weight": {
                "grad_norm": 0.5 + i, "param_norm": 3.0, "update_norm": 0.003}
                for i in range(LAYERS)}}


@pytest.fixture
def server(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, read_page_bytes=PAGE_BYTES)
    with LiveServer(settings) as srv:
        records = [{"kind": "run", "run_id": "r", "time": 0.0, "config": {"lr": 0.1}}]
        records += [_step(rank, step, "NaN" if step > 6 else 1.0)
                    for step in range(1, STEPS + 1) for rank in range(RANKS)]
        records.append({"kind": "end", "run_id": "r", "step": STEPS, "time": 99.0,
                        "status": "completed"})
        res = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=60)
        assert res.status_code == 200 and res.json()["accepted"] == len(records), res.text
        yield srv


def _follow(srv, path: str, items: str) -> list[list[dict]]:
    pages = []
    while path is not None:
        res = httpx.get(srv.url + path, timeout=30)
        assert res.status_code == 200, res.text
        pages.append(res.json()[items])
        path = res.json()["next"]
    return pages


def _key(record: dict) -> tuple:
    return record.get("step", -1), record["kind"], record.get("rank", 0)


def test_record_pages_end_mid_step_and_next_reads_on_without_gaps(server):
    pages = _follow(server, "/v1/runs/r/records?since_step=-1&limit=5&kind=run&kind=step",
                    "records")
    records = [r for page in pages for r in page]
    expected = [(-1, "run", 0)] + [(s, "step", k) for s in range(1, STEPS + 1)
                                   for k in range(RANKS)]
    assert [_key(r) for r in records] == expected  # in order, each once, filter kept
    assert all(len(page) <= 5 for page in pages)
    assert any(page[-1]["rank"] != RANKS - 1 for page in pages[:-1])  # a page ended mid-step
    assert records[-1]["loss"] == "NaN"


def test_a_large_limit_is_still_a_bounded_page(server):
    full = httpx.get(server.url + "/v1/runs/r/records?since_step=-1&limit=10000").json()
    assert full["next"] is not None and len(full["records"]) < RANKS * STEPS
    stored = sum(len(httpx.Request("GET", "/", json=r).content) for r in full["records"])
    assert stored < PAGE_BYTES + len(httpx.Request("GET", "/", json=_step(0, 1)).content) * 2
    pages = _follow(server, "/v1/runs/r/records?since_step=-1&limit=10000", "records")
    assert len([r for page in pages for r in page]) == 2 + RANKS * STEPS


def test_finding_pages_newest_first(server):
    whole = httpx.get(server.url + "/v1/runs/r/findings?limit=10000").json()
    assert whole["next"] is None and len(whole["findings"]) >= 4
    pages = _follow(server, "/v1/runs/r/findings?limit=3", "findings")
    assert [f for page in pages for f in page] == whole["findings"]
    assert len(pages) > 1 and all(len(page) <= 3 for page in pages)


def test_bad_cursors_are_refused_with_a_reason_and_unknown_runs_are_404(server):
    for bad in ("3:bogus:0", "99999999999999999999:step:0", "1:step:9999999999999999999"):
        res = httpx.get(server.url + f"/v1/runs/r/records?after={bad}")
        assert res.status_code == 422 and "after" in res.text, bad
    res = httpx.get(server.url + "/v1/runs/r/findings?before=0")
    assert res.status_code == 422 and "before" in res.text
    assert httpx.get(server.url + "/v1/runs/nope/records").status_code == 404


def test_run_pages_list_every_run_once(server):
    more = [{"kind": "step", "run_id": f"run:{i}", "step": 1, "time": 1.0, "loss": 1.0}
            for i in range(7)]
    assert httpx.post(server.url + "/v1/records", json={"records": more}).status_code == 200
    pages = _follow(server, "/v1/runs?limit=3", "runs")
    assert [len(page) for page in pages] == [3, 3, 2]
    assert sorted(r["run_id"] for page in pages for r in page) == sorted(
        ["r"] + [r["run_id"] for r in more])
    assert httpx.get(server.url + "/v1/runs?after=soon:r").status_code == 422


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
        def stored_only() -> dict:
            [stored] = httpx.get(srv.url + "/v1/runs", timeout=10).json()["runs"]
            assert not stored["active"], stored
            return stored

        stored = eventually(stored_only, timeout=30, interval=0.2, what="the run left memory")
        detail = httpx.get(srv.url + "/v1/runs/ttl", timeout=10).json()
    assert {k: v for k, v in stored.items() if k != "active"} == {
        k: v for k, v in live.items() if k != "active"}
    assert detail["last_step"] == live_detail["last_step"] == 12
    assert detail["attempts"] == live_detail["attempts"]
    assert detail["findings"] == live_detail["findings"]


def test_findings_of_replaced_steps_stay_stored_and_leave_the_current_view(tmp_path: Path):
    def steps(token: str, first: int, last: int, nan_at: int) -> list[dict]:
        return [{"kind": "step", "run_id": "re", "step": s, "time": 1.0 + s, "attempt": token,
                 "loss": float("nan") if s == nan_at else 2.0} for s in range(first, last + 1)]

    crashed = {"kind": "end", "run_id": "re", "step": 40, "time": 42.0, "status": "failed",
               "attempt": "a"}
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        for batch in (steps("a", 1, 40, nan_at=30) + [crashed], steps("b", 25, 50, nan_at=-1)):
            r = httpx.post(srv.url + "/v1/records", timeout=10,
                           content=b"\n".join(wire.dumps(x) for x in batch),
                           headers={"Content-Type": "application/x-ndjson"})
            assert r.json()["accepted"] == len(batch), r.text
        every = httpx.get(f"{srv.url}/v1/runs/re/findings", timeout=10).json()["findings"]
        current = httpx.get(f"{srv.url}/v1/runs/re/findings", params={"current": "true"},
                            timeout=10).json()["findings"]
    # attempt 1's crash (its failed end) is a finding of the replaced steps too
    assert sorted((f["type"], f["step"], f["attempt"]) for f in every) == [
        ("crashed", 40, 1), ("nan_inf", 30, 1)]
    assert current == []


def test_a_page_ending_on_a_hang_or_agreement_record_links_to_one_the_route_takes(
        tmp_path: Path):
    """Issue 35: every stored kind is a cursor's kind, so ``export --url`` and any client
    following ``next`` read past a page that ends on a hang or an agreement record."""
    records: list[dict] = [{"kind": "run", "run_id": "h", "time": 0.0,
                            "hardware": {"world_size": 2}}]
    records += [{"kind": "step", "run_id": "h", "rank": r, "step": s, "time": float(s),
                 "loss": "NaN" if (s, r) == (3, 1) else 1.0}  # a stop rule stops it: action 1
                for s in range(1, 4) for r in (0, 1)]
    records += [{"kind": "hang", "run_id": "h", "rank": r, "step": 3, "time": 40.0,
                 "stuck_seconds": 37.0, "threads": [{"name": "MainThread", "frames": [
                     {"file": "train.py", "line": 88, "function": "main"}]}]} for r in (0, 1)]
    # Rank 1 held that stop back (an agreement record is about an action the run took).
    held = {"kind": "agreement", "run_id": "h", "rank": 1, "step": 3, "time": 41.0,
            "action_id": 1, "action": "stop", "outcome": "missing"}
    rules = tmp_path / "rules.yaml"
    rules.write_text("routes: {page: [console]}\nrules:\n  - {name: StopOnNaN, match: "
                     "{types: [nan_inf]}, severity: critical, action: stop}\n")
    settings = load_settings(data_dir=tmp_path / "data", alerting={"rules_file": rules})
    with LiveServer(settings) as srv:
        res = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=30)
        assert res.status_code == 200 and res.json()["accepted"] == len(records), res.text
        assert [a["action"] for a in res.json()["actions"]] == ["stop"]
        res = httpx.post(srv.url + "/v1/records", json={"records": [held]}, timeout=30)
        assert res.status_code == 200 and res.json()["accepted"] == 1, res.text
        pages = _follow(srv, "/v1/runs/h/records?since_step=-1&limit=1", "records")
    kinds = [r["kind"] for page in pages for r in page]
    assert kinds == ["run"] + ["step"] * 6 + ["hang", "hang", "agreement"], kinds
