"""Attempts through the real engine and a real SQLite store: a resumed attempt is judged
from the detector state the run had at its start step, its findings kept apart from the
abandoned branch's, and all of it survives a sidecar restart."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import CollectorRegistry
from test_engine import RecordingSink

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas, wire
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store


def _steps(token: str, steps: range, nan_at: tuple[int, ...], end: str | None = None
           ) -> list[Incoming]:
    lines = [{"kind": "step", "run_id": "r", "step": s, "time": 100.0 + s, "attempt": token,
              "loss": math.nan if s in nan_at else 2.0} for s in steps]
    if end is not None:
        lines.append({"kind": "end", "run_id": "r", "step": steps[-1], "time": 200.0,
                      "status": end, "attempt": token})
    return [Incoming(i, *schemas.parse_for_store(obj)) for i, obj in enumerate(lines)]


def _findings(store: Store) -> list[tuple[str, int, int]]:
    return sorted((f["type"], f["step"], f["attempt"])
                  for f in map(wire.loads, store.findings("r", limit=100)))


def test_a_resumed_attempt_is_judged_from_the_state_at_its_start_step(tmp_path: Path):
    store, sink = Store(tmp_path / "monitor.sqlite"), RecordingSink()
    engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()), sink)
    engine.ingest(_steps("a", range(1, 101), nan_at=(5,)), now=1.0)
    engine.registry.snapshot(engine.registry.get("r"))  # below the checkpoint: restored
    engine.ingest(_steps("a", range(101, 151), nan_at=(140,), end="failed"), now=1.0)
    engine.registry.snapshot(engine.registry.get("r"))  # past the checkpoint: dropped
    sink.calls.clear()

    resumed = engine.ingest(_steps("b", range(120, 151), nan_at=(145,)), now=2.0)
    # Judged, not late, from the state at step 119: the NaN of the abandoned branch at
    # step 140 is history, not state (its repeat clock, 100 steps, would have held back
    # step 145's page); the kept NaN at step 5 is state, and 140 steps back.
    assert (resumed.accepted, resumed.duplicates, resumed.late) == (31, 0, 0)
    assert [(f.type, f.step, f.attempt) for f in resumed.findings] == [("nan_inf", 145, 2)]
    # (attempt 1 ended failed: its crash is a finding of the abandoned branch too)
    assert _findings(store) == [("crashed", 150, 1), ("nan_inf", 5, 1), ("nan_inf", 140, 1),
                                ("nan_inf", 145, 2)]
    # Rebuilding the kept steps 1-119 paged nobody again (their NaN at step 5 was paged
    # when it arrived), and attempt 1's end no longer ends the run; alerting heard of the
    # resume at step 120 (a pending rollback would be applied there).
    assert [(c[0], c[2]) for c in sink.calls] == [("attempt_settled", 120),
                                                  ("handle", ["nan_inf"])]
    run = engine.registry.get("r").state
    assert (run.ranks[0].last_step, run.ranks[0].steps_total, run.status) == (
        150, 150, "running")
    assert store.run_row("r").status == "running"

    # A restart rebuilds the same run from the current history only.
    again = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    assert again.recover(now=3.0) == 1
    live = again.registry.get("r")
    assert (live.state.ranks[0].steps_total, live.attempts.current) == (150, 2)
    late = again.ingest(_steps("a", range(149, 151), nan_at=()), now=4.0)  # a retry, late
    assert (late.duplicates, late.findings) == (2, [])
    store.close()


def test_a_process_that_ends_before_its_first_step_replaces_nothing(tmp_path: Path):
    store = Store(tmp_path / "monitor.sqlite")
    engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    engine.ingest(_steps("a", range(1, 11), nan_at=()), now=1.0)
    crashed = [{"kind": "run", "run_id": "r", "attempt": "b"},
               {"kind": "end", "run_id": "r", "step": 0, "time": 50.0, "status": "failed",
                "attempt": "b"}]
    engine.ingest([Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(crashed)],
                  now=2.0)
    assert [(a.number, a.kind) for a in store.attempts("r")] == [(1, "first"), (2, "pending")]
    assert [wire.loads(b)["step"] for b in store.records("r", kinds=("step",))] == list(
        range(1, 11))
    store.close()
