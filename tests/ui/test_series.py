"""The chart history and its downsampling: what a chart gets is what was recorded."""

from __future__ import annotations

import base64
import json
import math
import sqlite3
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from live_server import LiveServer
from monitor_agent.settings import load_settings
from monitor_agent.storage.database import StorageError
from monitor_agent.ui import series as sr
from monitor_agent.ui.history import SCHEMA, HistoryBuilder, open_history


def build(records: list[dict]) -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    builder = HistoryBuilder(db, ema_alpha=0.9)
    for rec in records:
        builder.add(rec)
    builder.commit()
    return db


def steps(n: int, over: dict[int, dict] | None = None) -> list[dict]:
    out = [{"kind": "run", "run_id": "r", "config": {"warmup_steps": 10, "total_steps": n},
            "model": {"layer_order": ["b", "a"]}}]
    for s in range(1, n + 1):
        rec = {"kind": "step", "run_id": "r", "step": s, "time": 1.0 + s, "loss": 2.0,
               "grad_norm": 1.0, "param_norm": 10.0, "update_norm": 0.01}
        rec.update((over or {}).get(s, {}))
        out.append(rec)
    return out


def test_a_one_step_spike_survives_downsampling():
    db = build(steps(10_000, {7_777: {"loss": 50.0}}))
    out = sr.scalars(db, "r", points=200)
    assert out["bucketed"] and len(out["steps"]) == 200 and out["count"] == 10_000
    loss = out["series"]["loss"]
    assert max(loss["max"]) == 50.0 and min(loss["min"]) == 2.0
    spike = loss["max"].index(50.0)
    assert out["steps"][spike] - 50 <= 7_777 <= out["steps"][spike] + 50
    assert max(loss["mean"]) < 50.0  # the mean alone would hide it


def test_a_short_range_comes_back_as_stored_with_its_ema_and_ratio():
    db = build(steps(50, {3: {"loss": 4.0}}))
    out = sr.scalars(db, "r", start=1, end=5, points=1000)
    assert not out["bucketed"] and out["steps"] == [1, 2, 3, 4, 5]
    assert out["series"]["loss"]["mean"] == [2.0, 2.0, 4.0, 2.0, 2.0]
    assert out["series"]["update_ratio"]["mean"][0] == 0.001
    ema = out["series"]["loss_ema"]["mean"]
    assert ema[0] == 2.0 and 2.0 < ema[2] < 4.0 and ema[3] < ema[2]


def test_non_finite_values_are_listed_not_lost():
    db = build(steps(20, {12: {"loss": "NaN"}, 15: {"grad_norm": "Infinity"}}))
    out = sr.scalars(db, "r", points=100)
    assert out["nonfinite_steps"] == [12, 15]
    assert out["series"]["loss"]["mean"][11] is None


def test_layer_matrix_is_in_model_order_with_max_per_bucket():
    recs = steps(1000)
    for rec in recs[1:]:
        s = rec["step"]
        rec["layers"] = {"a": {"grad_norm": 9.0 if s == 500 else 1.0},
                         "b": {"grad_norm": 0.5}, "c": {"grad_norm": 2.0}}
    db = build(recs)
    m = sr.matrix(db, "r", "grad_norm", points=100)
    assert m["names"] == ["b", "a", "c"]  # layer_order first, then names as they came
    n = len(m["steps"])
    assert n == 100
    values = np.frombuffer(base64.b64decode(m["values_f32"]), dtype="<f4").tolist()
    rows = [values[i * n:(i + 1) * n] for i in range(3)]
    assert set(rows[0]) == {0.5} and max(rows[1]) == 9.0 and set(rows[2]) == {2.0}


def test_update_band_follows_the_detectors_phases():
    band = sr.update_band([5, 500, 900], warmup=10, total=1000)
    assert band == {"low": [1e-3, 1e-4, 1e-5], "high": [1e-2, 1e-3, 1e-4]}


def test_series_endpoint_reads_the_sidecar_history(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path, token="t0k", auth_reads=True)
    auth = {"Authorization": "Bearer t0k"}
    body = "\n".join(json.dumps(r) for r in steps(300, {150: {"loss": 9.0}}))
    with LiveServer(settings) as srv:
        res = httpx.post(srv.url + "/v1/records", content=body, timeout=30,
                         headers={**auth, "content-type": "application/x-ndjson"})
        assert res.status_code == 200, res.text
        assert httpx.get(srv.url + "/v1/runs/r/series").status_code == 401  # auth_reads
        deadline = time.monotonic() + 20
        while True:
            res = httpx.get(srv.url + "/v1/runs/r/series?points=30", headers=auth)
            if res.status_code == 200 and res.json()["count"] == 300 or \
                    time.monotonic() > deadline:
                break
            time.sleep(0.1)
        out = res.json()
        assert out["count"] == 300 and len(out["steps"]) == 30 and out["bucketed"]
        assert max(out["series"]["loss"]["max"]) == 9.0
        assert out["warmup"] == 10 and out["total_steps"] == 300
        assert len(out["update_band"]["low"]) == 30
        zoom = httpx.get(srv.url + "/v1/runs/r/series?points=30&start=100&end=200",
                         headers=auth).json()
        assert zoom["range"] == [100, 200] and zoom["count"] == 101
        assert 100 <= zoom["steps"][0] < zoom["steps"][-1] <= 200
        bad = httpx.get(srv.url + "/v1/runs/r/series?points=1", headers=auth)
        assert bad.status_code == 422
        assert httpx.get(srv.url + "/v1/runs/nope/series", headers=auth).status_code == 404
        assert math.isfinite(out["series"]["loss"]["mean"][0])


def test_pre_aggregated_blocks_agree_with_the_steps_across_commits():
    recs = steps(20_000, {7_777: {"loss": 50.0}, 19_999: {"loss": 0.5}})
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    builder = HistoryBuilder(db, ema_alpha=0.9)
    for i, rec in enumerate(recs):  # commits that split blocks, as the live indexer does
        builder.add(rec)
        if i % 997 == 0:
            builder.commit()
    builder.commit()
    for points, level in ((10, 256), (100, 64), (300, 16), (5000, None)):
        assert sr.block_level(1, 20_000, points) == level
        out = sr.scalars(db, "r", points=points)
        loss = out["series"]["loss"]
        assert len(out["steps"]) <= points and out["steps"] == sorted(out["steps"])
        assert max(loss["max"]) == 50.0 and min(loss["min"]) == 0.5
        mean = sum(loss["mean"]) / len(loss["mean"])
        assert 1.9 < mean < 2.1
    times = sr.rank_step_times(db, "r", 1, 20_000, 20)
    assert list(times["ranks"]) == ["0"] and len(times["steps"]) <= 20


def test_layer_blocks_keep_a_one_step_layer_spike_at_any_zoom():
    recs = steps(20_000)
    for rec in recs[1:]:
        rec["layers"] = {"a": {"grad_norm": 7.0 if rec["step"] == 12_345 else 1.0},
                         "b": {"grad_norm": 0.5}}
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    builder = HistoryBuilder(db, ema_alpha=0.9)
    for i, rec in enumerate(recs):
        builder.add(rec)
        if i % 1500 == 0:
            builder.commit()
    builder.commit()
    for points in (10, 100, 300, 5000):  # levels 256, 64, 16 and the stored rows
        m = sr.matrix(db, "r", "grad_norm", points=points)
        n = len(m["steps"])
        values = np.frombuffer(base64.b64decode(m["values_f32"]), dtype="<f4")
        a, b = values[n:2 * n], values[:n]  # model order: b first (layer_order)
        assert n <= points and a.max() == 7.0 and set(b.tolist()) == {0.5}
        spike = m["steps"][int(a.argmax())]
        assert abs(spike - 12_345) <= 20_000 / points, (points, spike)



def test_the_history_raises_storage_errors_not_sqlite_ones(tmp_path: Path):
    with pytest.raises(StorageError) as caught:
        open_history(tmp_path / "absent.sqlite", readonly=True)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    db = build(steps(5))
    db.close()
    with pytest.raises(StorageError) as caught:
        sr.scalars(db, "r")
    assert isinstance(caught.value.__cause__, sqlite3.ProgrammingError)


def test_a_heatmap_answer_is_bounded_in_cells_whatever_the_run_sent():
    # A run at the chart's name cap (2,000) over 1,200 steps: 2,400,000 cells at full
    # resolution; the answer trades buckets for names instead.
    db = sqlite3.connect(":memory:", isolation_level=None)
    db.executescript(SCHEMA)
    builder = HistoryBuilder(db, ema_alpha=0.9)
    layers = {f"l{i}": {"grad_norm": 1.0} for i in range(2000)}
    for s in range(1, 1201):
        builder.add({"kind": "step", "run_id": "wide", "step": s, "time": float(s),
                     "layers": layers})
    builder.commit()
    out = sr.matrix(db, "wide", "grad_norm", points=sr.MAX_POINTS)
    cells = len(base64.b64decode(out["values_f32"])) // 4
    assert len(out["names"]) == 2000
    assert cells == len(out["names"]) * len(out["steps"]) <= 2_000_000
