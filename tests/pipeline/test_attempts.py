"""Attempts through the real engine and a real SQLite store: a resumed attempt is judged
from the detector state the run had at its start step, its findings kept apart from the
abandoned branch's, and all of it survives a sidecar restart."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas, wire
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store


def _steps(token: str, steps: range, nan_at: int) -> list[Incoming]:
    lines = [{"kind": "step", "run_id": "r", "step": s, "time": 100.0 + s, "attempt": token,
              "loss": math.nan if s == nan_at else 2.0} for s in steps]
    return [Incoming(i, *schemas.parse_for_store(obj)) for i, obj in enumerate(lines)]


def _findings(store: Store) -> list[tuple[str, int, int]]:
    return sorted((f["type"], f["step"], f["attempt"])
                  for f in map(wire.loads, store.findings("r", limit=100)))


def test_a_resumed_attempt_is_judged_from_the_state_at_its_start_step(tmp_path: Path):
    store = Store(tmp_path / "monitor.sqlite")
    engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    engine.ingest(_steps("a", range(1, 31), nan_at=25), now=1.0)
    engine.registry.snapshot(engine.registry.get("r"))  # a snapshot past the checkpoint

    resumed = engine.ingest(_steps("b", range(20, 31), nan_at=28), now=2.0)
    # Judged, not late: the detectors went back to step 19, and the NaN of the abandoned
    # branch at step 25 is history, not state the resumed branch inherits.
    assert (resumed.accepted, resumed.duplicates, resumed.late) == (11, 0, 0)
    assert [(f.type, f.step, f.attempt) for f in resumed.findings] == [("nan_inf", 28, 2)]
    assert _findings(store) == [("nan_inf", 25, 1), ("nan_inf", 28, 2)]
    run = engine.registry.get("r").state
    assert (run.ranks[0].last_step, run.ranks[0].steps_total) == (30, 30)

    # A restart rebuilds the same run from the current history only.
    again = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    assert again.recover(now=3.0) == 1
    live = again.registry.get("r")
    assert (live.state.ranks[0].steps_total, live.attempts.current) == (30, 2)
    late = again.ingest(_steps("a", range(29, 31), nan_at=0), now=4.0)  # attempt 1, late
    assert (late.duplicates, late.findings) == (2, [])
    store.close()
