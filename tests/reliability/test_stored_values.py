"""No stored or sent value breaks a subsystem: out-of-range integers are refused alone, every
gzip member is read, the chart history's thread skips what it cannot fold and goes on, and
the HTML report embeds any name inertly.

Real uvicorn on loopback, real HTTP, real SQLite, the real ``monitor-agent`` CLI.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from monitor_agent.records import wire
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import RecordRow, Store
from tests.eventually import eventually
from tests.live_server import LiveServer

NDJSON = {"content-type": "application/x-ndjson"}
BIG = 2**63  # one past SQLite's INTEGER; orjson still parses it as an int
HUGE = int("9" * 401)  # orjson gives up, the stdlib parses it: a Python int of 401 digits


def _steps(run_id: str, steps, **extra) -> list[dict]:
    return [{"kind": "step", "run_id": run_id, "step": s, "time": 1000.0 + s, "loss": 1.0,
             **extra} for s in steps]


@pytest.fixture
def srv(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path)) as server:
        yield server


def test_out_of_range_integers_are_refused_alone_naming_the_field(srv):
    batch = [
        {"kind": "run", "run_id": "wide-1", "config": {"warmup_steps": BIG}},
        {"kind": "run", "run_id": "wide-2", "hardware": {"gpus": [{"mem": HUGE}]}},
        {"kind": "run", "run_id": "wide-3", "model": {"n_params": -BIG - 1}},
        *_steps("wide-ok", range(1, 4)),
    ]
    # The stdlib writes the 401-digit integer as it is (orjson would refuse to).
    r = httpx.post(srv.url + "/v1/records", content=json.dumps({"records": batch}),
                   headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] == 3
    reasons = {x["index"]: x["reason"] for x in body["rejected"]}
    assert sorted(reasons) == [0, 1, 2]
    assert "config.warmup_steps: integer 9223372036854775808 is outside" in reasons[0]
    assert "hardware.gpus.0.mem: integer of 401 digits" in reasons[1]
    assert "model.n_params" in reasons[2] and "64-bit" in reasons[2]
    # The good records of the batch are stored; nothing of the refused ones is.
    stored = httpx.get(srv.url + "/v1/runs/wide-ok/records", params={"since_step": -1}).json()
    assert [x["step"] for x in stored["records"]] == [1, 2, 3]
    assert httpx.get(srv.url + "/v1/runs/wide-1").status_code == 404
    assert httpx.get(srv.url + "/readyz").status_code == 200


def test_every_gzip_member_is_read(srv):
    first = b"\n".join(wire.dumps(r) for r in _steps("members", [1])) + b"\n"
    second = wire.dumps(_steps("members", [2], loss=float("nan"))[0]) + b"\n"
    body = gzip.compress(first) + gzip.compress(second)  # what `cat a.gz b.gz` makes
    r = httpx.post(srv.url + "/v1/records", content=body,
                   headers={**NDJSON, "content-encoding": "gzip"})
    assert r.status_code == 200, r.text
    assert r.json()["accepted"] == 2
    stored = httpx.get(srv.url + "/v1/runs/members/records", params={"since_step": -1}).json()
    assert [(x["step"], x["loss"]) for x in stored["records"]] == [(1, 1.0), (2, "NaN")]
    # Garbage after a member is not a member: refused, not dropped in silence.
    r = httpx.post(srv.url + "/v1/records", content=gzip.compress(first) + b"junk",
                   headers={**NDJSON, "content-encoding": "gzip"})
    assert r.status_code == 400 and "gzip" in r.json()["detail"]


def test_chart_history_skips_a_stored_value_it_cannot_fold_and_goes_on(tmp_path: Path):
    # What an older version stored: a run whose warmup no SQLite INTEGER holds.
    store = Store(tmp_path / "monitor.sqlite")
    old = {"kind": "run", "run_id": "old", "time": 1.0, "config": {"warmup_steps": BIG}}
    store.insert_records([RecordRow("old", 0, "run", 0, 1.0, wire.dumps(old)),
                          *[RecordRow("old", 0, "step", s, 1.0 + s, wire.dumps(rec))
                            for s, rec in enumerate(_steps("old", [1, 2]), 1)]])
    store.close()

    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        r = httpx.post(srv.url + "/v1/records", json={"records": _steps("later", range(1, 6))})
        assert r.status_code == 200, r.text
        series = eventually(lambda: (s := httpx.get(srv.url + "/v1/runs/later/series"))
                            .status_code == 200 and s,
                           timeout=30, interval=0.1, what="the later run's charts")
        assert series.json()["range"] == [1, 5]
        # The old run's steps are charted too: only its run record was skipped.
        assert httpx.get(srv.url + "/v1/runs/old/series").json()["range"] == [1, 2]
        assert httpx.get(srv.url + "/readyz").json() == {"status": "ready"}
        metrics = httpx.get(srv.url + "/metrics").text
        assert 'monitor_agent_background_skipped_total{part="chart_history"} 1.0' in metrics


def test_replay_and_report_skip_what_they_reject_and_embed_names_inertly(tmp_path: Path):
    layers = {"<!--<script>": {"grad_norm": 1.0}, "</script><b>\u2028": {"grad_norm": 2.0}}
    lines = [
        {"kind": "run", "run_id": "hostile", "time": 1.0, "config": {"warmup_steps": BIG}},
        {"kind": "run", "run_id": "hostile", "time": 1.0, "hardware": {"n": HUGE}},
        *_steps("hostile", range(1, 21), layers=layers),
    ]
    trace = tmp_path / "hostile.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    report = tmp_path / "report.html"
    proc = subprocess.run([sys.executable, "-m", "monitor_agent", "replay", "--quiet", str(trace),
                           "--report", str(report)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "2 records rejected and skipped" in proc.stdout
    page = report.read_text()
    data = page[page.index("window.MONITOR_REPORT = "):]
    data = data[:data.index("</script>")]  # the data script ends where the HTML says
    assert "<" not in data and "\u2028" not in data
    embedded = json.loads(data[len("window.MONITOR_REPORT = "):].rstrip(";"))
    series = next(v for k, v in embedded["answers"].items() if k.endswith("/series"))
    assert series["layers"] == list(layers) and series["range"] == [1, 20]


def test_a_chart_history_that_cannot_work_fails_readyz_with_the_reason(tmp_path: Path):
    (tmp_path / "history.sqlite").mkdir()  # something in its place it cannot open
    with LiveServer(load_settings(data_dir=tmp_path)) as srv:
        assert httpx.post(srv.url + "/v1/records",
                          json={"records": _steps("blind", [1])}).status_code == 200
        ready = eventually(lambda: (r := httpx.get(srv.url + "/readyz")).status_code == 503
                           and r, timeout=60, interval=0.1, what="readyz red")
        assert ready.json()["reason"].startswith("chart history: "), ready.text
        assert "retrying" in ready.json()["reason"]
        # Records are still taken: a broken history costs charts, never a record.
        assert httpx.post(srv.url + "/v1/records",
                          json={"records": _steps("blind", [2])}).status_code == 200
