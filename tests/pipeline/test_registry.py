"""The runs in memory (pipeline/registry.py), with the engine's replay path and a real
store on disk: a run leaves memory and comes back as it was, a full registry makes room
only for a run silent long enough, a restart reloads the runs that were active, and a
snapshot that cannot be read costs time, not the run."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.pipeline.registry import SNAPSHOT_SHARE
from monitor_agent.records import schemas
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def _engine(tmp_path: Path, **settings: Any) -> Engine:
    return Engine(load_settings(data_dir=tmp_path, **settings),
                  Store(tmp_path / "monitor.sqlite"), SelfMetrics(CollectorRegistry()))


def _feed(engine: Engine, run_id: str, steps: range, now: float | None = None) -> None:
    items = [Incoming(i, *schemas.parse_for_store(
        {"kind": "step", "run_id": run_id, "step": s, "time": float(s), "loss": 2.0}))
        for i, s in enumerate(steps)]
    result = engine.ingest(items, now=float(steps[-1]) if now is None else now)
    assert result.accepted == len(items), result.rejected


def test_an_evicted_run_is_rebuilt_from_every_stored_record(tmp_path: Path):
    engine = _engine(tmp_path)
    _feed(engine, "r", range(1, 11))
    engine.registry.evict("r")  # its effects could not be committed: no snapshot
    assert engine.registry.get("r") is None
    engine.registry.reload_evicted(now=11.0)
    live = engine.registry.get("r")
    assert live is not None
    assert engine.replayed == 10
    assert live.state.last_step == 10 and live.state.ranks[0].steps_total == 10


def test_a_run_back_in_memory_replays_only_what_its_snapshot_does_not_cover(tmp_path: Path):
    engine = _engine(tmp_path)
    _feed(engine, "r", range(1, 8))
    engine.registry.snapshot(engine.registry.get("r"))
    _feed(engine, "r", range(8, 11))
    engine.registry.evict("r")
    _feed(engine, "r", range(11, 12))  # its next record loads it
    assert engine.replayed == 3  # steps 8-10; 1-7 came back with the snapshot
    assert engine.registry.get("r").state.ranks[0].steps_total == 11


def test_a_full_registry_takes_a_new_run_only_in_place_of_one_silent_long_enough(
        tmp_path: Path):
    engine = _engine(tmp_path, max_active_runs=1, run_displace_after_seconds=60.0)
    _feed(engine, "old", range(1, 4), now=100.0)
    refused = engine.ingest([Incoming(0, *schemas.parse_for_store(
        {"kind": "step", "run_id": "new", "step": 1, "time": 1.0}))], now=130.0)
    assert refused.accepted == 0
    assert "too many active runs" in refused.rejected[0]["reason"]

    _feed(engine, "new", range(1, 2), now=160.0)
    assert [live.run_id for live in engine.registry] == ["new"]
    assert engine.store.detector_state("old") is not None  # displaced with a snapshot
    # Its next record brings it back as it was (in place of "new", silent long enough).
    _feed(engine, "old", range(4, 5), now=230.0)
    assert engine.registry.get("old").state.ranks[0].steps_total == 4
    assert engine.replayed == 0


def test_a_restart_reloads_the_runs_active_before_it(tmp_path: Path):
    ttls = {"silent_run_ttl_seconds": 600.0, "ended_run_ttl_seconds": 60.0}
    engine = _engine(tmp_path, **ttls)
    _feed(engine, "active", range(1, 6))
    _feed(engine, "done", range(1, 3))
    engine.ingest([Incoming(0, *schemas.parse_for_store(
        {"kind": "end", "run_id": "done", "step": 2, "time": 3.0, "status": "completed"}))],
        now=3.0)
    engine.registry.snapshot_all()
    engine.store.close()

    # The store dates a run by the wall clock at ingest: two minutes later the ended run
    # is past its time-to-live, the running one is not.
    restarted = _engine(tmp_path, **ttls)
    assert restarted.recover(now=time.time() + 120.0) == 1
    assert [live.run_id for live in restarted.registry] == ["active"]
    assert restarted.registry.get("active").state.last_step == 5
    assert restarted.replayed == 0  # the snapshot covers every record


def test_runs_silent_past_their_time_to_live_leave_memory_and_keep_their_state(
        tmp_path: Path):
    engine = _engine(tmp_path, silent_run_ttl_seconds=600.0)
    _feed(engine, "r", range(1, 6), now=100.0)
    engine.registry.expire(now=700.0)
    assert engine.registry.get("r") is not None  # 600 s silent: not past its ttl yet
    engine.registry.expire(now=701.0)
    assert engine.registry.get("r") is None
    _feed(engine, "r", range(6, 7), now=702.0)
    assert engine.replayed == 0  # the snapshot taken on expiry covers every record
    assert engine.registry.get("r").state.ranks[0].steps_total == 6


def test_a_snapshot_that_cannot_be_restored_is_replaced_by_judging_every_record(
        tmp_path: Path):
    engine = _engine(tmp_path)
    _feed(engine, "r", range(1, 6))
    live = engine.registry.get("r")
    engine.store.save_detector_state("r", live.state.last_record_id, b"not a snapshot", 5)
    engine.registry.evict("r")
    _feed(engine, "r", range(6, 7))
    assert engine.replayed == 5
    assert engine.registry.get("r").state.ranks[0].steps_total == 6


def test_the_clock_snapshots_a_run_whose_snapshot_is_slow_less_often(tmp_path: Path):
    """A run leader of thousands of ranks takes seconds to snapshot one run: the clock's
    snapshots take at most SNAPSHOT_SHARE of the engine thread, so the next one waits
    for the last one's duration / SNAPSHOT_SHARE, not just snapshot_interval_seconds."""
    engine = _engine(tmp_path, snapshot_interval_seconds=10.0)
    registry = engine.registry
    _feed(engine, "r", range(1, 6), now=100.0)
    registry.snapshot_all(now=100.0)
    live = registry.get("r")
    assert live is not None and live.snapshot_at == 100.0
    taken = registry.snapshots
    _feed(engine, "r", range(6, 8), now=105.0)
    registry.snapshot_all(now=111.0)  # past the interval: a cheap run's is due
    assert registry.snapshots == taken + 1

    live.snapshot_seconds = 2.0  # as a 16,384-rank run's took on a busy machine
    _feed(engine, "r", range(8, 10), now=115.0)
    registry.snapshot_all(now=122.0)  # past the interval, not 2.0 / SNAPSHOT_SHARE
    assert registry.snapshots == taken + 1
    registry.snapshot_all(now=111.0 + 2.0 / SNAPSHOT_SHARE)
    assert registry.snapshots == taken + 2
