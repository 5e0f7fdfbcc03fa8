"""The chart history's downsampled reads: what a chart gets is what was recorded."""

from __future__ import annotations

import base64
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from monitor_agent.history import series as sr
from monitor_agent.history.builder import MAX_USER_SCALARS, HistoryBuilder
from monitor_agent.history.schema import History, open_history
from monitor_agent.storage.database import StorageError
from tests.chart_records import steps


def build(records: list[dict], commit_every: int | None = None) -> History:
    """The history of ``records``; ``commit_every``: commits that split blocks, as the
    live indexer's do."""
    db = open_history(":memory:")
    builder = HistoryBuilder(db, ema_alpha=0.9)
    for i, rec in enumerate(records):
        builder.add(rec)
        if commit_every and i % commit_every == 0:
            builder.commit()
    builder.commit()
    return db


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


def test_steps_the_guard_skipped_are_listed_apart_from_non_finite_ones():
    skip = {"skipped": True, "skip_reason": "grad_norm_outlier"}
    db = build(steps(5_000, {300: skip, 301: {"loss": "NaN"}, 4_000: {**skip, "grad_norm": "NaN",
                                                                     "skip_reason": "nonfinite_grad"},
                             4_500: {"skipped": True, "skip_reason": "loss_scale"}}))
    out = sr.scalars(db, "r", points=100)  # bucketed: the marks are exact steps all the same
    assert out["bucketed"]
    assert out["skipped_steps"] == [300, 4_000]
    assert out["nonfinite_steps"] == [301]  # the guard's NaN skip is its own mark


def test_a_guard_skipped_steps_loss_stays_out_of_the_line_and_the_ema():
    """Issue 31: the batch the guard skipped never reached the weights; its loss (6000
    here) must not set the loss axis nor lift the EMA the header shows."""
    skip = {"skipped": True, "skip_reason": "grad_norm_outlier", "loss": 6000.0}
    out = sr.scalars(build(steps(20, {12: skip})), "r", points=100)
    loss = out["series"]["loss"]["mean"]
    assert loss[11] is None and max(v for v in loss if v is not None) < 10
    assert max(v for v in out["series"]["loss_ema"]["mean"] if v is not None) < 10
    assert out["skipped_steps"] == [12] and out["nonfinite_steps"] == []


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


def test_the_scripts_own_scalars_are_charted_on_their_own_steps():
    over = {s: {"metrics": {"accuracy": s / 1000, "extra/ppl": 7.0}} for s in range(1, 1001)}
    over[500]["metrics"]["accuracy"] = "NaN"
    recs = steps(1000, over) + [
        {"kind": "eval", "run_id": "r", "step": s, "time": 1.0, "val_loss": 2.0,
         "metrics": {"bleu": s / 10, "loss/code": 2.5}} for s in (250, 500, 750)]
    db = build(recs)
    assert sr.user_names(db, "r") == ["accuracy", "extra/ppl", "eval/bleu"]
    out = sr.user_series(db, "r", 0, 1, 1000, 100, sr.user_names(db, "r"))
    acc = out["accuracy"]
    assert len(acc["steps"]) == 100 and max(acc["max"]) == 1.0 and min(acc["min"]) == 0.001
    assert set(out["extra/ppl"]["mean"]) == {7.0}
    assert out["eval/bleu"] == {"steps": [250, 500, 750], "mean": [25.0, 50.0, 75.0],
                                "min": None, "max": None}  # one eval per bucket: as stored
    exact = sr.user_series(db, "r", 0, 499, 501, 100, ["accuracy"])["accuracy"]
    assert exact["steps"] == [499, 500, 501] and exact["mean"][1] is None


def test_user_scalar_blocks_keep_a_one_step_spike_and_the_mean_at_any_zoom():
    recs = steps(20_000, {s: {"metrics": {"acc": 0.5}} for s in range(1, 20_001)})
    recs[12_345]["metrics"]["acc"] = 9.0  # step 12,345 (recs[0] is the run record)
    db = build(recs, commit_every=1500)
    for points, level in ((10, 256), (100, 64), (300, 16), (5000, None)):
        assert sr.block_level(1, 20_000, points) == level
        acc = sr.user_series(db, "r", 0, 1, 20_000, points, ["acc"])["acc"]
        assert len(acc["steps"]) <= points and acc["steps"] == sorted(acc["steps"])
        spike = acc["max"].index(9.0)
        assert abs(acc["steps"][spike] - 12_345) <= 20_000 / points, (points, spike)
        assert min(acc["min"]) == 0.5 and 0.5 <= sum(acc["mean"]) / len(acc["mean"]) < 0.51


def test_user_scalar_names_are_bounded_per_run():
    over = {s: {"metrics": {f"m{s}_{i}": 1.0 for i in range(10)}} for s in range(1, 41)}
    db = build(steps(40, over))
    names = sr.user_names(db, "r")
    assert len(names) == MAX_USER_SCALARS and names[0] == "m1_0"
    stored = db.execute("SELECT COUNT(DISTINCT name), MAX(name) FROM user_scalars").fetchone()
    assert stored == (MAX_USER_SCALARS, MAX_USER_SCALARS - 1)


def test_header_throughput_is_a_training_steps_rate_not_the_last_eval_steps():
    # Every 10th step evaluates and runs at a tenth of the rate; the last step is one.
    db = build(steps(200, {s: {"tokens_per_second": 5e3 if s % 10 == 0 else 5e4}
                           for s in range(1, 201)}))
    assert sr.latest(db, "r", 0)["tokens_per_second"] == 5e3
    assert sr.recent_throughput(db, "r", 0) == 5e4
    assert sr.recent_throughput(build(steps(5)), "r", 0) is None


def test_a_matrix_answer_is_bounded_in_cells_and_read_a_batch_at_a_time(monkeypatch):
    recs = steps(1000)
    for rec in recs[1:]:
        s = rec["step"]
        rec["layers"] = {f"l{i}": {"grad_norm": 9.0 if (s, i) == (777, 4) else 1.0}
                         for i in range(10)}
    db = build(recs)
    monkeypatch.setattr(sr, "MAX_MATRIX_CELLS", 240)  # 12 names: 20 buckets
    monkeypatch.setattr(sr, "MATRIX_BATCH_BYTES", 3 * 12 * 4)  # 3 rows a read
    m = sr.matrix(db, "r", "grad_norm", points=1000)
    n, row = len(m["steps"]), m["names"].index("l4")
    assert len(m["names"]) == 12 and n == 20  # b and a: the run's layer_order, never sent
    values = np.frombuffer(base64.b64decode(m["values_f32"]), dtype="<f4")
    spiked = values[row * n:(row + 1) * n]  # the spike survives in its bucket
    assert spiked.max() == 9.0 and abs(m["steps"][int(spiked.argmax())] - 777) <= 1000 / n
    assert set(values[(row - 1) * n:row * n].tolist()) == {1.0}


def test_update_band_follows_the_detectors_phases():
    band = sr.update_band([5, 500, 900], warmup=10, total=1000)
    assert band == {"low": [1e-3, 1e-4, 1e-5], "high": [1e-2, 1e-3, 1e-4]}


def test_pre_aggregated_blocks_agree_with_the_steps_across_commits():
    recs = steps(20_000, {7_777: {"loss": 50.0}, 19_999: {"loss": 0.5}})
    db = build(recs, commit_every=997)
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
    db = open_history(":memory:")
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



def test_a_heatmap_answer_is_bounded_in_cells_whatever_the_run_sent():
    # A run at the chart's name cap (2,000) over 1,200 steps: 2,400,000 cells at full
    # resolution; the answer trades buckets for names instead.
    db = open_history(":memory:")
    builder = HistoryBuilder(db, ema_alpha=0.9)
    layers = {f"l{i}": {"grad_norm": 1.0} for i in range(2000)}
    for s in range(1, 1201):
        builder.add({"kind": "step", "run_id": "wide", "step": s, "time": float(s),
                     "layers": layers})
    builder.commit()
    out = sr.matrix(db, "wide", "grad_norm", points=sr.MAX_POINTS)
    cells = len(base64.b64decode(out["values_f32"])) // 4
    assert len(out["names"]) == 2000
    assert cells == len(out["names"]) * len(out["steps"]) <= sr.MAX_MATRIX_CELLS


def test_the_history_raises_storage_errors_not_sqlite_ones(tmp_path: Path):
    with pytest.raises(StorageError) as caught:
        open_history(tmp_path / "absent.sqlite", readonly=True)
    assert isinstance(caught.value.__cause__, sqlite3.Error)
    db = build(steps(5))
    db.close()
    with pytest.raises(StorageError) as caught:
        sr.scalars(db, "r")
    assert isinstance(caught.value.__cause__, sqlite3.ProgrammingError)
