"""Issue 12: no single small record may erase history, break /metrics or answer 500.

Real uvicorn on loopback, real HTTP, real SQLite; one server for the module (every test
uses its own run ids).
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from monitor_agent.pipeline.retention import PRUNE_PASS_TICKS
from monitor_agent.records import limits
from monitor_agent.settings import load_settings
from tests.live_server import LiveServer
from tests.ticks import ticked

NDJSON = {"content-type": "application/x-ndjson"}


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    data = tmp_path_factory.mktemp("hostile")
    settings = load_settings(data_dir=data, retention_steps=1000, tick_interval_seconds=0.05,
                             max_record_bytes=256 * 1024)
    with LiveServer(settings) as server:
        yield server


def _steps(run_id: str, steps, **extra) -> list[dict]:
    return [{"kind": "step", "run_id": run_id, "step": s, "time": 1000.0 + s, "loss": 1.0,
             **extra} for s in steps]


def _post(srv, records: list[dict]) -> httpx.Response:
    return httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=30)


def _raw(srv, body: bytes, headers=NDJSON) -> httpx.Response:
    return httpx.post(srv.url + "/v1/records", content=body, headers=headers, timeout=30)


def _stored(srv, run_id: str) -> list[dict]:
    r = httpx.get(f"{srv.url}/v1/runs/{run_id}/records",
                  params={"since_step": -1, "limit": 10_000})
    return r.json()["records"] if r.status_code == 200 else []


def _metrics_ok(srv) -> str:
    r = httpx.get(srv.url + "/metrics")
    assert r.status_code == 200
    list(text_string_to_metric_families(r.text))  # raises on a broken exposition
    return r.text


def test_a_far_ahead_step_is_422_and_erases_nothing(srv):
    assert _post(srv, _steps("victim", range(1, 301))).json()["accepted"] == 300
    r = _post(srv, _steps("victim", [2**53], time=1301.0))
    assert r.status_code == 422 and "implausible" in r.json()["detail"], r.text
    # Within the jump budget, but far ahead: accepted, and still no wipe by retention
    # (which keeps at least retention_steps records, not "steps after the largest").
    assert _post(srv, _steps("other", range(1, 301))).json()["accepted"] == 300
    assert _post(srv, _steps("other", [300 + 99_999])).json()["accepted"] == 1
    ticked(srv.url, PRUNE_PASS_TICKS + 1)  # a whole retention pass over every run
    assert len([r for r in _stored(srv, "other") if r["kind"] == "step"]) == 301
    # The victim's next real step is analysed, not "late": its NaN is found.
    nan = _post(srv, [{"kind": "step", "run_id": "victim", "step": 301, "time": 1301.0,
                       "loss": "NaN"}])
    assert nan.json()["late"] == 0
    findings = httpx.get(srv.url + "/v1/runs/victim/findings").json()["findings"]
    assert any(f["type"] == "nan_inf" for f in findings)
    assert len(_stored(srv, "victim")) == 301


@pytest.mark.parametrize("config, budget", [
    ({"project": "a\ud800b"}, "lone UTF-16 surrogate"),
    ({"project": "p" * 300}, "budget of 256"),
    ({"project": {"nested": 1}}, "must be a string"),
    ({"notes": "x" * (limits.MAX_TEXT_LEN + 1)}, f"budget of {limits.MAX_TEXT_LEN}"),
    ({f"k{i}": i for i in range(limits.MAX_FREEFORM_ENTRIES + 1)}, "entries exceed"),
    ({"a\x00b": 1}, "control character"),
])
def test_free_form_strings_and_maps_have_budgets(srv, config, budget):
    body = json.dumps({"kind": "run", "run_id": "ff", "config": config}).encode()
    r = _raw(srv, body + b"\n")
    assert r.status_code == 422 and budget in r.json()["detail"], r.text
    assert 'run_id="ff"' not in httpx.get(srv.url + "/metrics").text
    _metrics_ok(srv)


def test_label_values_and_names_follow_the_same_rule(srv):
    for rec in ({"kind": "run", "run_id": "lb", "labels": {"team": "a\ud800"}},
                {"kind": "run", "run_id": "lb", "labels": {"team": "t\nx"}},
                {**_steps("lb", [1])[0], "layers": {"l\x07": {"grad_norm": 1.0}}},
                {**_steps("lb", [1])[0], "gpu": {"u\ud800": 1.0}}):
        r = _raw(srv, json.dumps(rec).encode())
        assert r.status_code == 422, (rec, r.text)
    _metrics_ok(srv)


@pytest.mark.parametrize("field, value", [
    ("step", True), ("step", "12"), ("step", 12.5), ("time", "NaN"), ("time", "Infinity"),
    ("time", True), ("run_id", "a/b"), ("run_id", "a b"),
])
def test_strict_identity_fields(srv, field, value):
    rec = {**_steps("strict", [1])[0], field: value}
    r = _raw(srv, json.dumps(rec).encode())
    assert r.status_code == 422 and field in r.json()["detail"], r.text


def test_bare_nonfinite_time_token_is_rejected(srv):
    r = _raw(srv, b'{"kind":"step","run_id":"t","step":1,"time":NaN}\n'
                  b'{"kind":"step","run_id":"t","step":2,"time":Infinity}\n')
    assert r.status_code == 422
    assert "+Inf" not in httpx.get(srv.url + "/metrics").text.split("last_step_timestamp")[-1][:200]


def test_bad_ndjson_lines_cost_only_themselves(srv):
    good = [json.dumps(r).encode() for r in _steps("lines", [1, 2, 3])]
    big = b'{"kind":"step","run_id":"lines","step":9,"time":1.0,"x":"' + b"y" * 300_000 + b'"}'
    body = b"\n".join([good[0], b"{not json", good[1], big, good[2], b"[1,2"])
    r = _raw(srv, body)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["accepted"] == 3
    reasons = {x["index"]: x["reason"] for x in out["rejected"]}
    assert set(reasons) == {1, 3, 5}
    assert "not valid JSON" in reasons[1] and "max_record_bytes" in reasons[3]


def test_unknown_fields_are_not_stored(srv):
    rec = {**_steps("junk", [1])[0], "junk": "z" * 50_000,
           "layers": {"a": {"grad_norm": 1.0, "extra": "q" * 10_000}},
           "memory": {"allocated_bytes": 1.0, "secret_field": "w" * 10_000}}
    r = _raw(srv, json.dumps(rec).encode())
    assert r.json()["accepted"] == 1
    stored = _stored(srv, "junk")[0]
    assert "junk" not in stored and "extra" not in stored["layers"]["a"]
    assert "secret_field" not in stored["memory"]
    assert len(json.dumps(stored)) < 1000


def test_histogram_and_value_budgets_are_named(srv):
    hist = {f"l{i}": {"edges": [0.0] * 1025, "counts": [0.0] * 1024} for i in range(200)}
    r = _post(srv, [{**_steps("hist", [1])[0], "grad_hist": hist}])
    assert r.status_code in (413, 422)
    assert "max_values_per_request" in r.text or "budget of" in r.text, r.text
    small = {f"l{i}": {"edges": [0.0] * 1025, "counts": [0.0] * 1024} for i in range(130)}
    r = _raw(srv, gzip.compress(json.dumps({**_steps("hist", [1])[0], "grad_hist": small})
                                .encode()), {**NDJSON, "content-encoding": "gzip"})
    assert r.status_code in (413, 422)
    assert "max_record_bytes" in r.text, r.text
    # Under the byte budgets, the histogram budget itself.
    hist = {f"l{i}": {"edges": [0] * 1025, "counts": [0] * 1024} for i in range(70)}
    rec = {**_steps("hist", [1])[0], "grad_hist": hist, "param_hist": hist}
    r = _post(srv, [rec])  # a JSON body: no per-line byte budget before parsing
    assert r.status_code == 422 and "numbers exceed the budget of" in r.text, r.text


def test_silence_with_nan_duration_is_422(srv):
    for duration in ("NaN", "Infinity", "-Infinity"):
        body = b'{"run_id": "x", "duration_seconds": ' + duration.encode() + b"}"
        r = httpx.post(srv.url + "/v1/silences", content=body,
                       headers={"content-type": "application/json"})
        assert r.status_code == 422, r.text
        assert "duration_seconds" in r.text


def test_rows_stored_by_an_older_version_break_nothing(tmp_path: Path):
    """A run record with a lone surrogate and a 1 MiB project, written straight into the
    store as an older sidecar would have: after a restart /metrics, /readyz and the run
    API still answer."""
    import sqlite3

    settings = load_settings(data_dir=tmp_path)
    with LiveServer(settings) as srv:
        assert _post(srv, _steps("old", [1, 2])).status_code == 200
        assert _post(srv, _steps("fine", [1, 2])).status_code == 200
    bad = ('{"kind":"run","run_id":"old","config":{"project":"a\\ud800b"},'
           '"labels":{"project":"' + "p" * (1 << 20) + '"}}').encode()
    db = sqlite3.connect(tmp_path / "monitor.sqlite")
    db.execute("UPDATE runs SET run_record = ? WHERE run_id = 'old'", (bad,))
    db.execute("INSERT INTO records (run_id, rank, kind, step, time, body) "
               "VALUES ('old', 0, 'run', -1, NULL, ?)", (bad,))
    db.commit()
    db.close()
    with LiveServer(settings) as srv:
        assert httpx.get(srv.url + "/readyz").status_code == 200
        text = _metrics_ok(srv)
        assert 'run_id="fine"' in text and 'run_id="old"' in text
        assert len(text) < 1 << 20
        for path in ("/v1/runs/old", "/v1/runs/old/records", "/v1/runs", "/v1/runs/fine"):
            assert httpx.get(srv.url + path).status_code == 200, path
        assert _post(srv, _steps("old", [3])).json()["accepted"] == 1


def test_too_many_runs_answers_429_with_retry_after(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, max_active_runs=1)) as srv:
        assert _post(srv, _steps("one", [1])).status_code == 200
        r = _post(srv, _steps("two", [1]))
        assert r.status_code == 429 and int(r.headers["retry-after"]) > 0


def test_run_ids_a_url_cannot_reach_are_refused_with_the_reason(srv):
    """``.`` and ``..`` would be stored, and then no URL could name them: every client
    resolves them away as path segments. The id rule refuses them at the boundary."""
    for run_id in (".", ".."):
        r = _post(srv, _steps(run_id, [1]))
        assert r.status_code == 422, (run_id, r.text)
        assert "path segment" in r.text, r.text
    assert not {".", ".."} & {run["run_id"] for run in httpx.get(srv.url + "/v1/runs")
                              .json()["runs"]}
    r = _post(srv, _steps("..dots.are.fine..", [1]))
    assert r.status_code == 200 and r.json()["accepted"] == 1
    assert httpx.get(srv.url + "/v1/runs/..dots.are.fine..").status_code == 200


# -- hang records (issue 23): a hostile stack, broken text, a forged rank -----------------

def _hang(run_id: str, rank: int = 0, **extra) -> dict:
    frames = [{"file": "train.py", "line": 88, "function": "main", "user": True}]
    return {"kind": "hang", "run_id": run_id, "step": 3, "time": 1010.0, "rank": rank,
            "stuck_seconds": 30.0, "threads": [{"name": "MainThread", "training": True,
                                                "frames": frames}], **extra}


def _hung_run(srv, run_id: str) -> None:
    run = {"kind": "run", "run_id": run_id, "hardware": {"world_size": 2}}
    assert _post(srv, [run, *_steps(run_id, range(1, 4)),
                       *_steps(run_id, range(1, 4), rank=1)]).status_code == 200


def _hangs_stored(srv, run_id: str) -> list[dict]:
    return [r for r in _stored(srv, run_id) if r["kind"] == "hang"]


def test_a_hang_record_with_a_100_mb_stack_is_413_and_stores_nothing(srv):
    _hung_run(srv, "hang-huge")
    frame = {"file": "x" * 200, "line": 1, "function": "f" * 200}
    threads = [{"name": "t", "frames": [frame] * 100}] * 2600  # about 100 MB of JSON
    body = json.dumps({"records": [_hang("hang-huge", threads=threads)]}).encode()
    assert len(body) > 100_000_000
    r = _raw(srv, body, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "max_body_bytes" in r.text
    assert _hangs_stored(srv, "hang-huge") == []
    assert _post(srv, [_hang("hang-huge")]).status_code == 200  # a sane one is stored
    assert len(_hangs_stored(srv, "hang-huge")) == 1


def test_a_hang_record_over_the_stack_budget_is_422_naming_it(srv):
    _hung_run(srv, "hang-budget")
    frame = {"file": "x" * 200, "line": 1, "function": "f" * 200}
    threads = [{"name": f"t{i}", "frames": [frame] * 100} for i in range(5)]  # ~210 KiB
    r = _post(srv, [_hang("hang-budget", threads=threads)])
    assert r.status_code == 422
    assert f"exceed the budget of {limits.MAX_HANG_STACK_BYTES}" in r.text
    assert _hangs_stored(srv, "hang-budget") == []


def test_non_utf8_frames_are_a_clear_4xx_and_store_nothing(srv):
    _hung_run(srv, "hang-utf8")
    line = json.dumps(_hang("hang-utf8")).encode().replace(b'"main"', b'"ma\xff\xfein"')
    r = _raw(srv, line, headers={"content-type": "application/json"})
    assert r.status_code == 400 and "not valid JSON" in r.text and "UTF-8" in r.text
    r = _raw(srv, line + b"\n")  # NDJSON: the line alone is rejected
    assert r.status_code == 422 and "UTF-8" in r.text
    lone = _hang("hang-utf8")
    lone["threads"][0]["frames"][0]["function"] = "ma\ud800in"  # a lone surrogate, escaped
    r = _raw(srv, json.dumps({"records": [lone]}).encode(),
             headers={"content-type": "application/json"})
    assert r.status_code == 422 and "surrogate" in r.text
    assert _hangs_stored(srv, "hang-utf8") == []


@pytest.mark.parametrize("rank", [2, 1_000, -1])
def test_a_hang_record_from_a_forged_rank_is_422_and_stores_nothing(srv, rank):
    run_id = f"hang-forged{rank}".replace("-1", "m1")
    _hung_run(srv, run_id)
    r = _post(srv, [_hang(run_id, rank=rank)])
    assert r.status_code == 422
    assert ("world_size 2" in r.text) if rank >= 0 else ("rank" in r.text and ">= 0" in r.text
                                                          or "greater than" in r.text)
    assert _hangs_stored(srv, run_id) == []
    assert _post(srv, [_hang(run_id, rank=1)]).status_code == 200  # a real rank is stored
    assert [h["rank"] for h in _hangs_stored(srv, run_id)] == [1]
