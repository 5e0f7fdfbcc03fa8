"""``POST /v1/records/preview`` through a real sidecar: a NaN step sent ahead of its backlog
pages at once, stores nothing, and its in-order copy joins that alert (one page, the same
findings and actions as a run delivered in order); the route refuses what ingest refuses."""

from __future__ import annotations

import gzip

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

NAN_FROM = 12  # first NaN step; nan_inf reports it, then the NaN 3 steps in a row (14)


def _records(run: str, steps: range) -> list[dict]:
    head = [{"kind": "run", "run_id": run, "config": {"total_steps": 100}}] if 1 in steps else []
    return head + [{"kind": "step", "run_id": run, "step": s, "time": 1000.0 + s,
                    "loss": "NaN" if s >= NAN_FROM else 2.0 - 0.01 * s, "grad_norm": 1.0}
                   for s in steps]


def _preview(url: str, records: list[dict], **kw) -> httpx.Response:
    return httpx.post(url + "/v1/records/preview", json={"records": records}, timeout=10, **kw)


def _findings(url: str, run: str) -> list[tuple]:
    found = httpx.get(f"{url}/v1/runs/{run}/findings").json()["findings"]
    return sorted((f["type"], f["step"], f["message"], str(f["evidence"])) for f in found)


def _actions(url: str, run: str) -> list[tuple]:
    return [(a["action"], a["step"], a["rule"])
            for a in httpx.get(f"{url}/v1/runs/{run}/actions").json()["actions"]]


def _pages(pd_receiver, run: str) -> list[dict]:
    return [r.json for r in pd_receiver.accepted()
            if r.json.get("payload", {}).get("custom_details", {}).get("run_id") == run]


def _wait_pages(pd_receiver, run: str, n: int, timeout: float = 10.0) -> list[dict]:
    def paged() -> list[dict]:
        pages = _pages(pd_receiver, run)
        assert len(pages) >= n, [r.json for r in pd_receiver.requests]
        return pages

    return eventually(paged, timeout=timeout, what=f"{n} pages for {run}")


def test_a_preview_pages_before_the_backlog_and_the_in_order_copy_joins_it(
        stopping_sidecar, pd_receiver):
    sc = stopping_sidecar
    # The reference: everything in order, one request per step as a live client sends it.
    for s in range(1, 21):
        assert sc.post(_records("ref", range(s, s + 1))).status_code == 200
    # The same run, but its steps 11.. wait in a client's spool and the NaN is previewed.
    assert sc.post(_records("prev", range(1, 11))).status_code == 200
    nan_step = _records("prev", range(NAN_FROM, NAN_FROM + 1))
    answer = _preview(sc.url, nan_step).json()
    assert answer == {"received": 1, "alerts": 1, "rejected": [], "unknown_run": []}

    [page] = _wait_pages(pd_receiver, "prev", 1)  # paged with the backlog not sent yet
    assert page["event_action"] == "trigger"
    assert page["payload"]["custom_details"]["step"] == NAN_FROM
    assert [r["step"] for r in sc.records("prev") if r["kind"] == "step"] == list(range(1, 11))
    assert _findings(sc.url, "prev") == []  # a preview stores neither record nor finding
    assert _preview(sc.url, nan_step).json()["alerts"] == 0  # already firing

    for s in range(11, 21):  # the backlog, in order
        assert sc.post(_records("prev", range(s, s + 1))).status_code == 200
    assert [r["step"] for r in sc.records("prev") if r["kind"] == "step"] == list(range(1, 21))
    assert _findings(sc.url, "prev") == [
        (t, s, m.replace("ref", "prev"), e) for t, s, m, e in _findings(sc.url, "ref")]
    assert _findings(sc.url, "ref") and _actions(sc.url, "ref")
    assert _actions(sc.url, "prev") == _actions(sc.url, "ref")  # action_after counts alike
    _wait_pages(pd_receiver, "ref", 1)
    keys = {p["dedup_key"] for p in _pages(pd_receiver, "prev")}
    assert len(keys) == 1  # one alert: the in-order finding folded into the previewed one
    alert = [a for a in httpx.get(sc.url + "/v1/alerts").json()["alerts"]
             if a["run_id"] == "prev"]
    assert len(alert) == 1 and alert[0]["last_step"] >= 14


def test_a_preview_for_a_stored_run_not_in_memory_pages_with_what_the_record_carries(
        stopping_sidecar, pd_receiver):
    sc = stopping_sidecar
    assert sc.post(_records("stranger", range(1, 3))).status_code == 200
    sc.kill()  # the restarted sidecar has the run stored, not yet in memory
    sc.start()
    answer = _preview(sc.url, [{"kind": "step", "run_id": "stranger", "rank": 3, "step": 500,
                                "time": 1.0, "loss": 1.0, "grad_norm": "Infinity"}]).json()
    assert answer["alerts"] == 1
    [page] = _wait_pages(pd_receiver, "stranger", 1)
    details = page["payload"]["custom_details"]
    assert (details["step"], details["rank"]) == (500, 3)
    assert "grad_norm is inf at step 500" in page["payload"]["summary"]
    assert [r["step"] for r in sc.records("stranger") if r["kind"] == "step"] == [1, 2]


def test_previews_for_made_up_runs_page_nothing_and_delay_no_real_page(
        stopping_sidecar, pd_receiver):
    """120 previews of runs nobody ingested took 120 alerts and held a real page behind
    them; a preview pages only what ingest could have paged, so they begin nothing."""
    sc = stopping_sidecar
    made_up = [{"kind": "step", "run_id": f"ghost-{i}", "step": 1, "time": 1.0, "loss": "NaN"}
               for i in range(120)]
    for chunk in range(0, 120, 40):  # under max_records_per_request
        answer = _preview(sc.url, made_up[chunk:chunk + 40]).json()
        assert answer["received"] == 40 and answer["alerts"] == 0
        assert answer["unknown_run"] == list(range(40))  # a client may send them again
    assert sc.post(_records("real", range(1, NAN_FROM + 1))).status_code == 200
    [page] = _wait_pages(pd_receiver, "real", 1)
    assert page["payload"]["custom_details"]["step"] == NAN_FROM
    assert [a["run_id"] for a in httpx.get(sc.url + "/v1/alerts").json()["alerts"]] == ["real"]
    assert len(pd_receiver.requests) == 1


def test_a_preview_of_a_finite_or_amp_overflow_step_pages_nothing(stopping_sidecar):
    sc = stopping_sidecar
    steps = [{"kind": "step", "run_id": "amp", "step": 1, "time": 1.0, "loss": 2.0},
             {"kind": "step", "run_id": "amp", "step": 2, "time": 2.0, "loss": 2.0,
              "grad_norm": "Infinity", "loss_scale": 65536.0},
             {"kind": "step", "run_id": "amp", "step": 3, "time": 3.0, "loss": 2.0,
              "grad_norm": "NaN", "skipped": True}]
    assert _preview(sc.url, steps).json() == {"received": 3, "alerts": 0, "rejected": [],
                                              "unknown_run": [0, 1, 2]}  # never stored
    assert httpx.get(sc.url + "/v1/alerts").json()["alerts"] == []


@pytest.fixture
def guarded(tmp_path):
    settings = load_settings(data_dir=tmp_path, token="s3cret-token", max_body_bytes=4096,
                             max_decompressed_bytes=65536)
    with LiveServer(settings) as srv:
        yield srv


def test_previews_are_refused_as_ingest_refuses(guarded):
    sc = guarded
    auth = {"Authorization": "Bearer s3cret-token"}
    nan = {"kind": "step", "run_id": "r", "step": 1, "time": 1.0, "loss": "NaN"}
    assert _preview(sc.url, [nan]).status_code == 401
    assert _preview(sc.url, [nan], headers={"Authorization": "Bearer wrong"}).status_code == 401
    big = [{**nan, "step": s} for s in range(1, 200)]
    assert _preview(sc.url, big, headers=auth).status_code == 413
    bomb = gzip.compress(b"{" * 10 + b" " * 100_000)
    r = httpx.post(sc.url + "/v1/records/preview", content=bomb, timeout=10,
                   headers={**auth, "Content-Encoding": "gzip", "Content-Type": "application/json"})
    assert r.status_code == 413
    bad = _preview(sc.url, [{"kind": "step", "run_id": "r", "step": "1", "time": 1.0}],
                   headers=auth)
    assert bad.status_code == 422 and "step" in bad.json()["detail"]
    mixed = _preview(sc.url, [{"kind": "step", "run_id": "r"}, nan], headers=auth).json()
    assert mixed["received"] == 1 and [r["index"] for r in mixed["rejected"]] == [0]


@pytest.mark.parametrize("path", ["/v1/records", "/v1/records/preview"])
def test_both_routes_take_the_same_bodies_in_openapi(sidecar, path):
    doc = httpx.get(sidecar.url + "/openapi.json").json()
    body = doc["paths"][path]["post"]["requestBody"]["content"]
    assert set(body) == {"application/json", "application/x-ndjson"}


def test_previews_of_runs_not_in_memory_count_against_the_new_run_budget(sidecar_factory,
                                                                         tmp_path):
    # Stored runs that left memory: a preview of each would load a detector suite and begin
    # an alert (and a page) of its own; a request brings at most max_new_runs_per_request in.
    config = tmp_path / "budget.yaml"
    config.write_text("ended_run_ttl_seconds: 0\nmax_new_runs_per_request: 8\n")
    sc = sidecar_factory(config=config).start()
    runs = [f"stored-{i}" for i in range(20)]
    for batch in (runs[:8], runs[8:16], runs[16:]):
        r = sc.post([rec for run in batch for rec in (
            {"kind": "step", "run_id": run, "step": 1, "time": 1.0, "loss": 1.0},
            {"kind": "end", "run_id": run, "step": 1, "time": 2.0})])
        assert r.status_code == 200 and r.json()["accepted"] == 2 * len(batch), r.text
    eventually(lambda: not any(httpx.get(f"{sc.url}/v1/runs/{run}").json().get("active")
                               for run in runs),
               timeout=20, interval=0.1, what="the ended runs left memory")
    nans = [{"kind": "step", "run_id": run, "step": 2, "time": 3.0, "loss": "NaN"}
            for run in runs]
    answer = _preview(sc.url, nans).json()
    assert answer["received"] == 20 and answer["alerts"] == 8
    assert len(httpx.get(sc.url + "/v1/alerts").json()["alerts"]) == 8


def test_a_preview_changes_when_the_page_goes_out_not_what_is_alerted(sidecar):
    """A warning from before the NaN (the gradient clipped on most steps) alerts on its own
    whether the NaN step was previewed ahead of its backlog or not: the page a preview
    begins early groups only what comes after its step (alerting/related.py)."""
    def steps(run: str, span: range) -> list[dict]:
        return [{"kind": "step", "run_id": run, "step": s, "time": 1000.0 + s,
                 "loss": "NaN" if s >= 60 else 2.0 - 0.01 * s, "grad_norm": 1.8,
                 "clip_threshold": 1.0} for s in span]

    def alerts(run: str) -> dict[str, int]:
        found = httpx.get(sidecar.url + "/v1/alerts", params={"run_id": run}).json()["alerts"]
        return {a["alertname"]: a["related"] for a in found}

    assert sidecar.post(steps("ref", range(1, 71))).status_code == 200
    assert sidecar.post(steps("prev", range(1, 11))).status_code == 200
    assert _preview(sidecar.url, steps("prev", range(60, 61))).json()["alerts"] == 1
    assert sidecar.post(steps("prev", range(11, 71))).status_code == 200  # the backlog
    assert "TrainingGradientHealth" in alerts("ref") and "TrainingNanInf" in alerts("ref")
    assert alerts("prev") == alerts("ref")
