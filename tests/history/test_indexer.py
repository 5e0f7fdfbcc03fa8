"""The chart history's abandoned branches, folded by the real indexer from a real store the
real engine filled (pipeline/attempts.py decides what a resume replaced)."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.history import series
from monitor_agent.history.indexer import MAX_BRANCH_POINTS, HistoryIndexer
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas
from monitor_agent.settings import Settings
from monitor_agent.storage.database import Database
from monitor_agent.storage.store import Store


def _send(engine: Engine, token: str, steps: range, now: float = 1.0) -> None:
    lines = [{"kind": "step", "run_id": "r", "step": s, "time": float(s), "attempt": token,
              "loss": 2.0 + (s % 7) / 100, "grad_norm": 1.0} for s in steps]
    for i in range(0, len(lines), 500):
        engine.ingest([Incoming(j, *schemas.parse_for_store(o))
                       for j, o in enumerate(lines[i:i + 500])], now=now)


def _catch_up(indexer: HistoryIndexer, store: Store) -> None:
    src = Database(store.path, (), readonly=True)
    try:
        while indexer.catch_up(src):
            pass
    finally:
        src.close()


def test_a_long_abandoned_branch_is_kept_thinned_and_a_restart_drops_it(tmp_path: Path):
    store = Store(tmp_path / "monitor.sqlite")
    engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    indexer = HistoryIndexer(store.path, tmp_path / "history.sqlite", 0.99, 0)
    _send(engine, "a", range(1, 3001))
    _send(engine, "b", range(501, 601), now=100.0)  # rolled back to 500: 501..3000 abandoned
    _catch_up(indexer, store)
    db = indexer.builder.db

    [branch] = series.branches(db, "r", rank=0)
    assert branch["attempt"] == 2 and branch["rolled_back_to"] == 500
    steps = branch["steps"]
    # Bounded: evenly thinned to at most MAX_BRANCH_POINTS, from the first abandoned step
    # to the last one, where the branch was given up.
    assert 2500 // 3 <= len(steps) <= MAX_BRANCH_POINTS + 1 < 2500
    assert (steps[0], steps[-1]) == (501, 3000)
    assert len({b - a for a, b in zip(steps, steps[1:], strict=False)}) == 1
    assert branch["loss"][-1] == 2.0 + 3000 % 7 / 100
    # Zoomed in, only the abandoned steps in the view.
    [zoomed] = series.branches(db, "r", 0, start=900, end=1000)
    assert zoomed["steps"] == [s for s in steps if 900 <= s <= 1000]
    # The current history is one line: 1..600, the resumed values from 501 on.
    assert series.scalars(db, "r", points=10_000)["steps"] == list(range(1, 601))

    # A second rollback keeps the first branch and adds its own.
    _send(engine, "c", range(551, 561), now=200.0)
    _catch_up(indexer, store)
    assert [(b["attempt"], b["rolled_back_to"], b["steps"][0], b["steps"][-1])
            for b in series.branches(db, "r", 0)] == [(2, 500, 501, 3000), (3, 550, 551, 600)]

    # A new run reusing the id starts over: the old run's branches are not its own.
    _send(engine, "d", range(1, 11), now=300.0)
    _catch_up(indexer, store)
    assert series.branches(db, "r", 0) == []
    assert series.scalars(db, "r")["steps"] == list(range(1, 11))
    db.close()
    store.close()
