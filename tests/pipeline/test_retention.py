"""Retention (pipeline/retention.py): the store keeps each rank's last ``retention_steps``
steps, through the engine's tick and a real store."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.pipeline.retention import PRUNE_PASS_TICKS, Retention
from monitor_agent.records import schemas, wire
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def _engine(tmp_path: Path, retention_steps: int = 100) -> Engine:
    return Engine(load_settings(data_dir=tmp_path, retention_steps=retention_steps),
                  Store(tmp_path / "monitor.sqlite"), SelfMetrics(CollectorRegistry()))


def _feed(engine: Engine, keys: list[tuple[int, int]], now: float) -> None:
    """Step records of (rank, step), one request."""
    items = [Incoming(i, *schemas.parse_for_store(
        {"kind": "step", "run_id": "r", "rank": rank, "step": step, "time": float(step),
         "loss": 2.0})) for i, (rank, step) in enumerate(keys)]
    assert engine.ingest(items, now=now).accepted == len(items)


def _stored(engine: Engine, rank: int) -> list[int]:
    return [wire.loads(body)["step"] for body in engine.store.records("r")
            if wire.loads(body).get("rank", 0) == rank]


def test_the_tick_keeps_each_ranks_own_newest_steps(tmp_path: Path):
    engine = _engine(tmp_path, retention_steps=100)
    _feed(engine, [(0, s) for s in range(1, 106)] + [(1, s) for s in range(1, 51)], now=105.0)
    for n in range(PRUNE_PASS_TICKS):  # one full pass over the (run, rank) keys
        engine.tick(106.0 + n)
    assert _stored(engine, 0) == list(range(6, 106))
    assert _stored(engine, 1) == list(range(1, 51))  # fewer than 100: nothing to prune


def test_a_far_ahead_step_does_not_make_the_history_before_it_look_old(tmp_path: Path):
    engine = _engine(tmp_path)
    _feed(engine, [(0, s) for s in range(1, 11)] + [(0, 40)], now=40.0)
    retention = Retention(engine.store, retention_steps=5)
    retention.prune_some(engine.registry.states())
    # Steps after 40 - 5 = 35 would leave one record; the five newest records stay.
    assert _stored(engine, 0) == [7, 8, 9, 10, 40]


def test_a_run_out_of_memory_keeps_its_records_until_it_is_back(tmp_path: Path):
    engine = _engine(tmp_path)
    _feed(engine, [(0, s) for s in range(1, 7)], now=6.0)
    Retention(engine.store, retention_steps=2).prune_some([])  # no live run
    assert _stored(engine, 0) == [1, 2, 3, 4, 5, 6]
