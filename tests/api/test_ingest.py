"""POST /v1/records over real HTTP to a real uvicorn server with a real SQLite store."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest

from monitor_agent.records.tokens import shown
from monitor_agent.settings import load_settings
from tests.live_server import LiveServer


def _records(run_id: str = "r1", steps: int = 5) -> list[dict]:
    recs: list[dict] = [{
        "kind": "run", "run_id": run_id, "time": 100.0,
        "config": {"lr": 0.1, "total_steps": 100}, "model": {"n_params": 10},
        "hardware": {"device": "cpu"}, "labels": {"project": "demo", "pod": "p-1"},
    }]
    for s in range(1, steps + 1):
        recs.append({
            "kind": "step", "run_id": run_id, "step": s, "time": 100.0 + s, "loss": 2.0 / s,
            "lr": 0.1, "grad_norm": 1.0, "param_norm": 10.0, "update_norm": 0.01,
            "tokens": 128, "samples": 4, "step_time": 0.05,
            "layers": {"a.weight": {"grad_norm": 0.5, "param_norm": 3.0, "update_norm": 0.003},
                       "b.weight": {"grad_norm": 0.7, "param_norm": 4.0, "update_norm": 0.004}},
        })
    recs.append({"kind": "eval", "run_id": run_id, "step": steps, "time": 200.0,
                 "val_loss": 1.5, "metrics": {"accuracy": 0.5}})
    recs.append({"kind": "end", "run_id": run_id, "step": steps, "time": 201.0,
                 "status": "completed"})
    return recs


@pytest.fixture
def server(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, max_body_bytes=256 * 1024,
                                  max_decompressed_bytes=256 * 1024)) as srv:
        yield srv


def _post(srv, body, **kw) -> httpx.Response:
    return httpx.post(srv.url + "/v1/records", content=body, timeout=10, **kw)


def _stored(srv, run_id: str) -> list[dict]:
    r = httpx.get(f"{srv.url}/v1/runs/{run_id}/records", params={"since_step": -1})
    return r.json()["records"] if r.status_code == 200 else []


def test_every_record_kind_round_trips(server):
    recs = _records()
    r = httpx.post(server.url + "/v1/records", json={"records": recs})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == len(recs)
    stored = _stored(server, "r1")
    assert [x["kind"] for x in stored] == ["run"] + ["step"] * 5 + ["eval", "end"]
    assert stored[0]["labels"] == {"project": "demo", "pod": "p-1"}
    assert stored[3]["loss"] == pytest.approx(2.0 / 3)
    assert stored[3]["layers"]["b.weight"]["grad_norm"] == 0.7
    detail = httpx.get(server.url + "/v1/runs/r1").json()
    assert detail["status"] == "completed"
    assert detail["last_step"] == 5
    assert detail["ranks"]["0"]["val_loss"] == 1.5


def test_non_finite_values_survive_both_encodings(server):
    bare = (b'{"kind":"step","run_id":"nf","step":1,"time":1.0,"loss":NaN,"grad_norm":Infinity}\n'
            b'{"kind":"step","run_id":"nf","step":2,"time":2.0,"loss":"NaN","grad_norm":"-Infinity"}\n')
    r = _post(server, bare, headers={"content-type": "application/x-ndjson"})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 2
    stored = _stored(server, "nf")
    assert [s["loss"] for s in stored] == ["NaN", "NaN"]
    assert [s["grad_norm"] for s in stored] == ["Infinity", "-Infinity"]
    metrics = httpx.get(server.url + "/metrics").text
    assert 'training_loss{project="",run_id="nf",rank="0"} NaN' in metrics
    assert 'training_grad_norm{project="",run_id="nf",rank="0"} -Inf' in metrics


def test_gzip_ndjson(server):
    body = "\n".join(json.dumps(r) for r in _records("gz")).encode()
    r = _post(server, gzip.compress(body),
              headers={"content-type": "application/x-ndjson", "content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == len(_records("gz"))


def test_retries_are_idempotent(server):
    recs = _records("idem")
    first = httpx.post(server.url + "/v1/records", json={"records": recs}).json()
    again = httpx.post(server.url + "/v1/records", json={"records": recs}).json()
    assert first["accepted"] == len(recs) and first["duplicates"] == 0
    assert again["accepted"] == 0 and again["duplicates"] == len(recs)
    assert len(_stored(server, "idem")) == len(recs)
    metrics = httpx.get(server.url + "/metrics").text
    assert 'training_steps_total{project="demo",run_id="idem",rank="0"} 5' in metrics


def test_out_of_order_steps_are_stored_but_reported_late(server):
    recs = [r for r in _records("ooo") if r["kind"] == "step"]
    httpx.post(server.url + "/v1/records", json={"records": recs[3:]})
    r = httpx.post(server.url + "/v1/records", json={"records": recs[:3]}).json()
    assert r["accepted"] == 3 and r["late"] == 3
    assert [s["step"] for s in _stored(server, "ooo")] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize(
    ("body", "headers", "status", "needle"),
    [
        (b"{not json", {"content-type": "application/json"}, 400, "not valid JSON"),
        (b'{"nope": 1}', {"content-type": "application/json"}, 400, '{"records": [...]}'),
        (b"\xff\xfe\x00garbage", {"content-type": "application/json"}, 400, "not valid JSON"),
        (b"[" * 5000 + b"]" * 5000, {"content-type": "application/json"}, 400, "nested too deeply"),
        (b'{"records":[{"kind":"run","run_id":"d","config":' + b"{\"a\":" * 20_000 + b"1"
         + b"}" * 20_001 + b"]}", {"content-type": "application/json"}, 400, "nested too deeply"),
        (b'{"records":[{"kind":"run","run_id":"d","config":' + b"{\"a\":" * 200 + b"1"
         + b"}" * 201 + b"]}", {"content-type": "application/json"}, 422, "config: Value error"),
        (b'{"records":[]}', {"content-type": "text/csv"}, 415, "Content-Type"),
        (b'{"records":[]}', {"content-encoding": "br", "content-type": "application/json"}, 415, "Content-Encoding"),
        (b"not gzip", {"content-encoding": "gzip", "content-type": "application/json"}, 400, "gzip"),
        (b"x" * (300 * 1024), {"content-type": "application/json"}, 413, "max_body_bytes"),
        (gzip.compress(b" " * (1024 * 1024)),
         {"content-encoding": "gzip", "content-type": "application/json"}, 413, "inflated"),
    ],
    ids=["malformed", "no-envelope", "invalid-utf8", "deep-list", "deep-config",
         "deep-section", "csv", "brotli",
         "bad-gzip", "too-large", "gzip-bomb"],
)
def test_bad_bodies_get_a_clear_4xx_and_store_nothing(server, body, headers, status, needle):
    r = _post(server, body, headers=headers)
    assert r.status_code == status, r.text
    assert needle in r.json()["detail"]
    assert httpx.get(server.url + "/v1/runs").json()["runs"] == []


@pytest.mark.parametrize(
    ("record", "needle"),
    [
        ({"kind": "step", "run_id": "x", "step": -1, "time": 1}, "step"),
        ({"kind": "step", "run_id": "x", "step": 1, "time": "yesterday"}, "time"),
        ({"kind": "step", "run_id": "x", "step": 1, "time": 1, "loss": [1]}, "loss"),
        ({"kind": "hello", "run_id": "x"}, "kind"),
        ({"kind": "step", "run_id": "bad id with spaces", "step": 1, "time": 1}, "run_id"),
        ({"kind": "end", "run_id": "x", "time": 1, "status": "exploded"}, "status"),
        ("just a string", "JSON object"),
    ],
)
def test_invalid_records_are_rejected_with_the_field_named(server, record, needle):
    good = {"kind": "step", "run_id": "ok", "step": 1, "time": 1.0, "loss": 1.0}
    r = httpx.post(server.url + "/v1/records", json={"records": [good, record]})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] == 1
    assert body["rejected"][0]["index"] == 1
    assert needle in body["rejected"][0]["reason"]
    alone = httpx.post(server.url + "/v1/records", json={"records": [record]})
    assert alone.status_code == 422 and needle in alone.json()["detail"]


def test_unknown_fields_are_ignored(server):
    rec = {"kind": "step", "run_id": "u", "step": 1, "time": 1.0, "loss": 1.0, "future": {"x": 1}}
    assert httpx.post(server.url + "/v1/records", json={"records": [rec]}).json()["accepted"] == 1
    assert _stored(server, "u")[0]["loss"] == 1.0


def test_unknown_run_is_404(server):
    assert httpx.get(server.url + "/v1/runs/nope").status_code == 404
    assert httpx.get(server.url + "/v1/runs/nope/records").status_code == 404


def test_metrics_cover_the_run(server):
    httpx.post(server.url + "/v1/records", json={"records": _records("m")[:-1]})
    text = httpx.get(server.url + "/metrics").text
    for needle in (
        'training_loss{project="demo",run_id="m",rank="0"} 0.4',
        'training_update_ratio{project="demo",run_id="m",rank="0"} 0.001',
        'training_layer_grad_norm{project="demo",run_id="m",rank="0",layer="b.weight"} 0.7',
        'training_step_duration_seconds_bucket{project="demo",run_id="m",rank="0",le="0.05"} 5',
        'training_run_info{project="demo",run_id="m",pod="p-1",status="running",'
        'verdict="healthy"} 1',
        'training_val_loss{project="demo",run_id="m",rank="0"} 1.5',
        'monitor_agent_ingest_records_total{outcome="accepted"}',
    ):
        assert needle in text, needle


@pytest.mark.parametrize("params", [{"since_step": 2**70}, {"since_step": -5},
                                    {"limit": 0}, {"limit": 10**9}])
def test_out_of_range_query_numbers_get_422_not_500(server, params):
    r = httpx.get(server.url + "/v1/runs/x/records", params=params)
    assert r.status_code == 422, r.text


def _with_attempt(recs: list[dict], token: str | None) -> list[dict]:
    return [{**r, "attempt": token} if token is not None else r for r in recs]


def test_a_retried_batch_of_an_attempt_is_an_exact_duplicate(server):
    batch = _with_attempt(_records("retry", steps=5), "tok-a")
    first = httpx.post(server.url + "/v1/records", json={"records": batch}, timeout=10).json()
    again = httpx.post(server.url + "/v1/records", json={"records": batch}, timeout=10).json()
    assert (first["accepted"], first["duplicates"]) == (len(batch), 0)
    assert (again["accepted"], again["duplicates"], again["late"]) == (0, len(batch), 0)
    [(attempt)] = again["attempts"]
    assert (attempt["token"], attempt["number"], attempt["kind"]) == ("tok-a", 1, "first")
    detail = httpx.get(f"{server.url}/v1/runs/retry", timeout=10).json()
    assert [a["number"] for a in detail["attempts"]] == [1]
    assert len(_stored(server, "retry")) == len(batch)
    # The very same records from another process are another attempt, not duplicates.
    other = httpx.post(server.url + "/v1/records", timeout=10,
                       json={"records": _with_attempt(_records("retry", 5), "tok-b")}).json()
    assert (other["accepted"], other["duplicates"]) == (len(batch), 0)
    assert other["attempts"][0]["number"] == 2 and other["attempts"][0]["kind"] == "restarted"


def test_records_without_an_attempt_are_one_implicit_attempt_as_before(server):
    recs = _records("legacy", steps=5)
    httpx.post(server.url + "/v1/records", json={"records": recs}, timeout=10)
    # An older client run again with the same id: duplicates, exactly as before attempts.
    again = httpx.post(server.url + "/v1/records", json={"records": recs}, timeout=10).json()
    assert (again["accepted"], again["duplicates"]) == (0, len(recs))
    assert [(a["token"], a["number"], a["kind"]) for a in again["attempts"]] == [("", 1, "first")]
    detail = httpx.get(f"{server.url}/v1/runs/legacy", timeout=10).json()
    assert [(a["number"], a["kind"], a["steps"]) for a in detail["attempts"]] == [(1, "first", 5)]


def test_other_ranks_of_a_launch_join_its_attempt(server):
    def rank(r: int, token: str, steps: range) -> list[dict]:
        return [{"kind": "step", "run_id": "ddp", "rank": r, "step": s, "time": 1.0 + s,
                 "loss": 1.0, "attempt": token} for s in steps]

    crashed = {"kind": "end", "run_id": "ddp", "rank": 0, "step": 10, "time": 12.0,
               "status": "failed", "attempt": "a0"}  # the launch ended: relaunched at 6
    for batch in (rank(0, "a0", range(1, 11)), rank(1, "a1", range(1, 11)) + [crashed],
                  rank(1, "b1", range(6, 16)), rank(0, "b0", range(6, 16))):
        r = httpx.post(server.url + "/v1/records", json={"records": batch}, timeout=10)
        assert r.json()["accepted"] == len(batch), r.text
    detail = httpx.get(f"{server.url}/v1/runs/ddp", timeout=10).json()
    assert [(a["number"], a["kind"], a["start_step"]) for a in detail["attempts"]] == [
        (1, "first", 1), (2, "resumed", 6)]
    current = httpx.get(f"{server.url}/v1/runs/ddp/records", timeout=10,
                        params={"kind": "step", "limit": 100}).json()["records"]
    assert sorted((r["rank"], r["step"]) for r in current) == sorted(
        (rk, s) for rk in (0, 1) for s in range(1, 16))
    # Which processes sent them, as reads show a token: its digest (records/tokens.py).
    assert {r["attempt"] for r in current if r["step"] >= 6} == {shown("b0"), shown("b1")}


def test_a_bad_attempt_token_is_refused_with_a_reason(server):
    bad = [{"kind": "step", "run_id": "tok", "step": 1, "time": 1.0, "attempt": "a/b"}]
    r = httpx.post(server.url + "/v1/records", json={"records": bad}, timeout=10)
    assert r.status_code == 422 and "attempt" in r.text
    assert httpx.get(f"{server.url}/v1/runs/tok", timeout=10).status_code == 404


def test_records_past_max_attempts_per_run_are_refused_with_a_reason(tmp_path: Path):
    def batch(token: str) -> list[dict]:  # each process runs two steps and ends
        return [{"kind": "step", "run_id": "many", "step": s, "time": 1.0 + s, "loss": 1.0,
                 "attempt": token} for s in (1, 2)] + [
            {"kind": "end", "run_id": "many", "step": 2, "time": 4.0, "attempt": token}]

    with LiveServer(load_settings(data_dir=tmp_path, max_attempts_per_run=2)) as srv:
        for token in ("a", "b"):
            r = httpx.post(srv.url + "/v1/records", json={"records": batch(token)}, timeout=10)
            assert r.json()["accepted"] == 3, r.text
        refused = httpx.post(srv.url + "/v1/records", json={"records": batch("c")}, timeout=10)
        detail = httpx.get(f"{srv.url}/v1/runs/many", timeout=10).json()
    assert refused.status_code == 422
    assert "max_attempts_per_run=2" in refused.json()["detail"]
    assert [a["number"] for a in detail["attempts"]] == [1, 2]
