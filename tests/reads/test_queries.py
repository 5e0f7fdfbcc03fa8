"""The read side's questions about runs (reads/queries.py), through the engine and a real
store: each answer the same while the run is in memory and once it left (the runs lists'
goodput decoded once and not every poll), an unknown run told apart from an empty answer."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.reads.queries import RunQueries
from monitor_agent.records import schemas, wire
from monitor_agent.runs.goodput import GoodputLedger
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def test_goodput_in_the_runs_lists_live_and_once_the_run_left_memory(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path)
    engine = Engine(settings, Store(":memory:"), SelfMetrics(CollectorRegistry()))
    # Up 2 s before step 1, then 1 s steps, step 5 waits 3 s more on its loader.
    lines: list[dict] = [{"kind": "run", "run_id": "r", "time": 100.0}]
    t = 102.0
    for s in range(1, 21):
        t += 1.0 + (3.0 if s == 5 else 0.0)
        lines.append({"kind": "step", "run_id": "r", "step": s, "time": t, "loss": 2.0,
                      "data_time": 3.0 if s == 5 else 0.0})
    lines.append({"kind": "end", "run_id": "r", "step": 20, "time": t, "status": "completed"})
    lines.append({"kind": "run", "run_id": "empty", "time": 100.0})
    engine.ingest([Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(lines)],
                  now=200.0)
    queries = RunQueries(engine.store, engine.registry)
    report = engine.registry.get("r").state.goodput.report()
    assert report.badput["input"] == pytest.approx(3.0)

    live = {s.run_id: s.goodput for s in queries.run_summaries(now=200.0)}
    assert live == {"r": pytest.approx(report.ratio), "empty": None}
    assert [x.goodput for x in queries.run_listings(now=200.0)] == [
        pytest.approx(report.ratio), None]

    engine.registry.expire(now=200.0 + settings.ended_run_ttl_seconds + 1)
    assert engine.registry.get("r") is None
    reads: list[str] = []
    stored_goodput = engine.registry.stored_goodput

    def counted(run_id: str) -> GoodputLedger:
        reads.append(run_id)
        return stored_goodput(run_id)

    engine.registry.stored_goodput = counted  # type: ignore[method-assign]
    for _ in range(3):  # polled: the stored ledger is decoded once for the lists
        stored = {s.run_id: s.goodput for s in queries.run_summaries(now=300.0)}
        assert stored == live
        assert queries.goodput("r", 300.0)["goodput_ratio"] == pytest.approx(report.ratio)
    assert reads == ["r"] * (1 + 3)  # and each time GET .../goodput asks


def _engine_with(tmp_path: Path, objs: list[dict], now: float = 200.0) -> Engine:
    engine = Engine(load_settings(data_dir=tmp_path), Store(tmp_path / "monitor.sqlite"),
                    SelfMetrics(CollectorRegistry()))
    result = engine.ingest([Incoming(i, *schemas.parse_for_store(o))
                            for i, o in enumerate(objs)], now=now)
    assert not result.rejected, result.rejected
    return engine


def _steps(run_id: str, last: int, nan_at: int | None = None) -> list[dict]:
    return [{"kind": "step", "run_id": run_id, "step": s, "time": float(s),
             "loss": float("nan") if s == nan_at else 2.0} for s in range(1, last + 1)]


def _leave_memory(engine: Engine) -> None:
    engine.registry.expire(now=1e12)
    assert len(engine.registry) == 0


def test_a_run_reads_the_same_in_memory_and_once_it_left(tmp_path: Path):
    engine = _engine_with(tmp_path, _steps("r", 30, nan_at=25))
    queries = RunQueries(engine.store, engine.registry)
    live = queries.run_detail("r")
    assert live is not None and live.active
    assert live.last_step == 30
    assert live.finding_counts == {"nan_inf": 1}
    assert [f["type"] for f in live.recent_findings] == ["nan_inf"]
    assert live.ranks is not None and live.ranks["0"]["steps_total"] == 30
    assert live.verdict is not None
    assert (live.verdict.state, live.verdict.cause, live.verdict.step) == ("unhealthy", "nan_inf", 25)

    _leave_memory(engine)
    stored = queries.run_detail("r")
    assert stored is not None and not stored.active
    assert (stored.last_step, stored.finding_counts, stored.recent_findings) == (
        live.last_step, live.finding_counts, live.recent_findings)
    assert stored.verdict == live.verdict
    assert queries.run_detail("no-such-run") is None


def test_checkpoints_page_by_position_and_by_step_range_live_or_stored(tmp_path: Path):
    saves = [{"kind": "checkpoint", "run_id": "r", "step": s, "time": s + 0.5,
              "path": f"/ckpt/{s}.pt"} for s in (20, 40, 60, 80, 100)]
    engine = _engine_with(tmp_path, _steps("r", 120) + saves)
    queries = RunQueries(engine.store, engine.registry)

    def pages() -> list[list[int]]:
        out = []
        for args in ({"limit": 2}, {"after": (40, 1), "limit": 2}, {"after": (80, 1)},
                     {"start": 50, "end": 90}):
            answer = queries.checkpoints("r", **args)
            assert answer is not None
            judged, last_clean = answer
            assert last_clean is not None and last_clean.step == 100
            out.append([j.entry.step for j in judged])
        return out

    live = pages()
    assert live == [[20, 40], [60, 80], [100], [60, 80]]
    _leave_memory(engine)
    assert pages() == live
    assert queries.checkpoints("no-such-run") is None


def test_records_tell_an_unknown_run_from_one_with_nothing_more(tmp_path: Path):
    engine = _engine_with(tmp_path, _steps("r", 5))
    queries = RunQueries(engine.store, engine.registry)
    chunk = queries.records_chunk("r", 0, None, ("step",), max_rows=3, max_bytes=1 << 20)
    assert chunk is not None and len(chunk) == 3
    rest = queries.records_chunk("r", 0, chunk[-1][0], ("step",), 10, 1 << 20)
    assert rest is not None
    assert [wire.loads(body)["step"] for _, body in chunk + rest] == [1, 2, 3, 4, 5]
    assert queries.records_chunk("r", 6, None, ("step",), 10, 1 << 20) == []
    assert queries.records_chunk("no-such-run", 0, None, ("step",), 10, 1 << 20) is None


def test_metrics_expose_only_the_runs_in_memory(tmp_path: Path):
    engine = _engine_with(tmp_path, _steps("a", 3) + _steps("b", 3))
    queries = RunQueries(engine.store, engine.registry)
    assert sorted(run.run_id for run in queries.exposed_runs()) == ["a", "b"]
    _leave_memory(engine)
    assert queries.exposed_runs() == []
    assert [row.run_id for row in queries.run_listings()] == ["a", "b"]  # still stored
