"""The runs lists' goodput (``RunQueries.goodput_ratio``): a live run's ledger, the same
ratio from the stored ledger once the run left memory, decoded once and not every poll."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.reads.queries import RunQueries
from monitor_agent.records import schemas
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
                      "data_time": 3.01 if s == 5 else 0.01})
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
