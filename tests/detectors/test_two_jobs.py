"""``two_jobs``: a replaced attempt of a run id still sending is a second live job. The rule
lives in the engine (it alone sees attempts), so it is proven through the real engine and
a real store: a late spool of the replaced job is history, a record from after the
replacement began pages once, and the job's own faults are still judged and paged."""

from __future__ import annotations

import math
from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas, wire
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store


def _steps(token: str, steps: range, t0: float, nan_at: tuple[int, ...] = ()) -> list[Incoming]:
    lines = [{"kind": "step", "run_id": "r", "step": s, "time": t0 + s, "attempt": token,
              "loss": math.nan if s in nan_at else 2.0} for s in steps]
    return [Incoming(i, *schemas.parse_for_store(obj)) for i, obj in enumerate(lines)]


def _findings(store: Store) -> list[tuple[str, int, int, bool]]:
    return sorted((f["type"], f["step"], f["attempt"], "partial view" in f["message"])
                  for f in map(wire.loads, store.findings("r", limit=100)))


def test_a_replaced_job_still_sending_pages_once_and_is_still_judged(tmp_path: Path):
    store = Store(tmp_path / "monitor.sqlite")
    engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    engine.ingest(_steps("a", range(1, 101), t0=1000.0), now=1100.0)
    # Job b starts the run id over at sidecar time 1200: a restart, the history is its.
    engine.ingest(_steps("b", range(1, 11), t0=1200.0), now=1200.0)
    # Job a's spool, written before b began, is delivered late: history, not analysed.
    late = engine.ingest(_steps("a", range(101, 103), t0=1090.0, nan_at=(102,)), now=1300.0)
    assert late.late == 2 and _findings(store) == []
    # Job a is still running: its next NaN step comes from after b began.
    live = engine.ingest(_steps("a", range(103, 106), t0=1200.0, nan_at=(104,)), now=1310.0)
    assert live.late == 3
    assert _findings(store) == [("nan_inf", 104, 1, True), ("two_jobs", 103, 2, False)]
    [page] = [f for f in live.findings if f.type == "two_jobs"]
    assert page.evidence == {"earlier_attempt": 1, "later_attempt": 2, "later_start_step": 1,
                             "seconds_after": 103.0}
    # The run's current history is job b's, untouched by job a's records.
    assert engine.registry.get("r").state.last_step == 10
