"""/v1/alerts and /v1/silences through the real app on a real uvicorn server."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

TOKEN = "api-token-123"
AUTH = {"authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def server(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, token=TOKEN,
                             alerting={"console": {"enabled": True}, "group_wait_seconds": 0})
    with LiveServer(settings) as srv:
        yield srv


def _nan_run(url: str, run_id: str = "r1") -> None:
    records = [{"kind": "run", "run_id": run_id, "labels": {"project": "p"}}]
    records += [{"kind": "step", "run_id": run_id, "step": s, "time": 1000.0 + s, "loss": 2.0}
                for s in range(1, 6)]
    records.append({"kind": "step", "run_id": run_id, "step": 6, "time": 1006.0, "loss": "NaN"})
    r = httpx.post(url + "/v1/records", json={"records": records}, headers=AUTH, timeout=10)
    assert r.status_code == 200, r.text


def _firing(url: str) -> list[dict]:
    return eventually(
        lambda: httpx.get(url + "/v1/alerts", params={"state": "firing"}).json()["alerts"],
        what="an alert fired")


def test_alerts_list_ack_and_filters(server: LiveServer):
    _nan_run(server.url)
    [alert] = _firing(server.url)
    assert (alert["alertname"], alert["severity"], alert["run_id"]) == ("TrainingNanInf", "critical", "r1")
    assert httpx.get(server.url + "/v1/alerts", params={"run_id": "other"}).json()["alerts"] == []
    assert httpx.get(server.url + "/v1/alerts", params={"state": "bogus"}).status_code == 422
    fp = alert["fingerprint"]
    assert httpx.post(f"{server.url}/v1/alerts/{fp}/ack", json={"by": "ana"}).status_code == 401
    r = httpx.post(f"{server.url}/v1/alerts/{fp}/ack", json={"by": "ana"}, headers=AUTH)
    assert r.status_code == 200 and r.json()["acked_by"] == "ana"
    r = httpx.post(f"{server.url}/v1/alerts/nope/ack", json={}, headers=AUTH)
    assert r.status_code == 404 and "GET /v1/alerts" in r.json()["detail"]
    run = httpx.get(server.url + "/v1/runs/r1").json()
    assert [a["fingerprint"] for a in run["alerts"]] == [fp]


def test_silences_create_list_expire(server: LiveServer):
    body = {"run_id": "r1", "type": "nan_inf", "duration_seconds": 600, "created_by": "ana"}
    assert httpx.post(server.url + "/v1/silences", json=body).status_code == 401
    r = httpx.post(server.url + "/v1/silences", json=body, headers=AUTH)
    assert r.status_code == 201
    silence = r.json()
    _nan_run(server.url)
    [alert] = _firing(server.url)
    assert alert["silenced"] is True
    listed = httpx.get(server.url + "/v1/alerts", params={"state": "silenced"}).json()["alerts"]
    assert [a["fingerprint"] for a in listed] == [alert["fingerprint"]]
    assert [s["id"] for s in httpx.get(server.url + "/v1/silences").json()["silences"]] == [silence["id"]]
    assert httpx.delete(f"{server.url}/v1/silences/{silence['id']}", headers=AUTH).status_code == 204
    assert httpx.delete(f"{server.url}/v1/silences/{silence['id']}", headers=AUTH).status_code == 404
    assert httpx.get(server.url + "/v1/silences").json()["silences"] == []
    expired = httpx.get(server.url + "/v1/silences", params={"include_expired": True}).json()
    assert len(expired["silences"]) == 1


def test_silences_are_listed_a_page_at_a_time(server: LiveServer):
    """Issue 35: expired silences are kept, so the list is paged like every other."""
    made = []
    for i in range(5):
        body = {"run_id": f"r{i}", "duration_seconds": 600, "comment": "c" * 900}
        made.append(httpx.post(server.url + "/v1/silences", json=body, headers=AUTH).json())
    httpx.delete(f"{server.url}/v1/silences/{made[0]['id']}", headers=AUTH)
    pages, path = [], "/v1/silences?limit=2&include_expired=true"
    while path is not None:
        got = httpx.get(server.url + path, timeout=10).json()
        pages.append([s["id"] for s in got["silences"]])
        path = got["next"]
    newest_first = [s["id"] for s in sorted(made, key=lambda s: (s["created_at"], s["id"]),
                                            reverse=True)]
    assert [i for page in pages for i in page] == newest_first
    assert [len(page) for page in pages] == [2, 2, 1]
    active = httpx.get(server.url + "/v1/silences?limit=10").json()
    assert {s["id"] for s in active["silences"]} == {s["id"] for s in made[1:]}
    assert active["next"] is None
    assert httpx.get(server.url + "/v1/silences?before=soon:ab").status_code == 422


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"duration_seconds": 60}, "at least one of"),
        ({"run_id": "r1"}, "duration_seconds"),
        ({"run_id": "r1", "duration_seconds": -5}, "duration_seconds"),
        ({"run_id": "r1", "duration_seconds": 60, "colour": "red"}, "colour"),
        ({"run_id": "", "duration_seconds": 60}, "run_id"),
    ],
)
def test_bad_silences_get_a_clear_422(server: LiveServer, body: dict, field: str):
    r = httpx.post(server.url + "/v1/silences", json=body, headers=AUTH)
    assert r.status_code == 422
    assert field in r.text


def test_the_alerts_list_is_paged_and_next_reads_on_without_gaps(server: LiveServer):
    for i in range(12):
        _nan_run(server.url, f"paged-{i:02d}")
    whole = httpx.get(server.url + "/v1/alerts", params={"limit": 1000}).json()
    assert whole["next"] is None and len(whole["alerts"]) == 12
    pages, path = [], "/v1/alerts?limit=5"
    while path is not None:
        answer = httpx.get(server.url + path, timeout=10).json()
        pages.append(answer["alerts"])
        path = answer["next"]
    assert [len(p) for p in pages] in ([5, 5, 2], [5, 5, 2, 0])  # the last page may be empty
    assert [a["fingerprint"] for p in pages for a in p] == [
        a["fingerprint"] for a in whole["alerts"]]  # newest first, each once
    # filters travel in the link; silenced ones are read on until the page is full
    httpx.post(server.url + "/v1/silences", headers=AUTH, json={
        "run_id": "paged-03", "duration_seconds": 600}).raise_for_status()
    silenced = httpx.get(server.url + "/v1/alerts",
                         params={"state": "silenced", "limit": 1}).json()
    assert [a["run_id"] for a in silenced["alerts"]] == ["paged-03"]
    bad = httpx.get(server.url + "/v1/alerts", params={"before": "1e3x:ab"})
    assert bad.status_code == 422 and "before" in bad.text
