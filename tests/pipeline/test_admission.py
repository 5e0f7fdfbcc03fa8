"""What one request may bring into memory (pipeline/admission.py), through the engine and
a real store: a record over a budget is refused alone, naming the budget, and nothing of it
is stored; the same record in a later request is taken."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def _engine(tmp_path: Path, **settings: Any) -> tuple[Engine, CollectorRegistry]:
    registry = CollectorRegistry()
    engine = Engine(load_settings(data_dir=tmp_path, **settings),
                    Store(tmp_path / "monitor.sqlite"), SelfMetrics(registry, "test"))
    return engine, registry


def _steps(*keys: tuple[str, int, int]) -> list[Incoming]:
    """Step records of (run id, rank, step)."""
    return [Incoming(i, *schemas.parse_for_store(
        {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": float(step),
         "loss": 2.0})) for i, (run, rank, step) in enumerate(keys)]


def _refused(registry: CollectorRegistry, reason: str) -> float:
    return registry.get_sample_value("monitor_agent_ingest_rejections_total",
                                     {"reason": reason}) or 0.0


def test_a_request_brings_at_most_max_new_runs_per_request_runs(tmp_path: Path):
    engine, registry = _engine(tmp_path, max_new_runs_per_request=2)
    result = engine.ingest(_steps(("a", 0, 1), ("b", 0, 1), ("c", 0, 1), ("a", 0, 2)), now=2.0)
    assert result.accepted == 3  # a run already brought in costs nothing more
    [refused] = result.rejected
    assert refused["index"] == 2
    assert "run c is new" in refused["reason"]
    assert "max_new_runs_per_request=2" in refused["reason"]
    assert _refused(registry, "too_many_new_runs") == 1
    assert [row.run_id for row in engine.store.runs()] == ["a", "b"]

    again = engine.ingest(_steps(("c", 0, 1)), now=3.0)  # the client's next request
    assert again.accepted == 1 and not again.rejected
    assert engine.registry.get("c") is not None


def test_a_run_holds_at_most_max_ranks_per_run_ranks_over_any_number_of_requests(
        tmp_path: Path):
    engine, registry = _engine(tmp_path, max_ranks_per_run=2)
    assert engine.ingest(_steps(("r", 0, 1), ("r", 1, 1)), now=1.0).accepted == 2
    result = engine.ingest(_steps(("r", 2, 1), ("r", 0, 2)), now=2.0)
    assert result.accepted == 1  # rank 0 is known: its next step is taken
    [refused] = result.rejected
    assert refused["index"] == 0
    assert refused["reason"] == "rank 2 would be run r's third rank, more than max_ranks_per_run=2"
    assert sorted(engine.registry.get("r").state.ranks) == [0, 1]
    assert _refused(registry, "too_many_ranks") == 1


def test_a_request_brings_at_most_max_new_ranks_per_request_ranks(tmp_path: Path):
    engine, _ = _engine(tmp_path, max_new_ranks_per_request=2)
    result = engine.ingest(_steps(*(("r", rank, 1) for rank in range(4))), now=1.0)
    assert result.accepted == 2
    assert [r["index"] for r in result.rejected] == [2, 3]
    assert all("max_new_ranks_per_request=2" in r["reason"] for r in result.rejected)
    # The refused ranks join with the client's next request, up to the same budget.
    assert engine.ingest(_steps(("r", 2, 1), ("r", 3, 1)), now=2.0).accepted == 2
    assert sorted(engine.registry.get("r").state.ranks) == [0, 1, 2, 3]


def test_a_new_rank_counts_once_however_many_of_its_records_a_request_holds(tmp_path: Path):
    engine, _ = _engine(tmp_path, max_new_ranks_per_request=1, max_ranks_per_run=2)
    result = engine.ingest(_steps(("r", 0, 1), ("r", 0, 2), ("r", 0, 3)), now=3.0)
    assert result.accepted == 3 and not result.rejected
    result = engine.ingest(_steps(("r", 1, 1), ("r", 1, 2)), now=4.0)
    assert result.accepted == 2 and not result.rejected
