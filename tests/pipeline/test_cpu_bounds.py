"""What a record costs the engine, held to its bound by operation counts, not timings
(issue 35, class 3: one client must not stall the engine for every run).

- the checkpoint ledger judges one entry per checkpoint added, and a fault only the
  entries it turns suspect (it re-judged every entry on every add: O(n^2) over a run);
- a resume replays about ``snapshot_every_steps`` steps of records, however often the
  run walks back (it replayed the whole history on each);
- ``gpu_health``'s throttle check reads the other ranks' medians from an ordered
  structure kept up as records arrive, one rank refreshed a record (it took the median of
  every other rank's window on every record);
- the engine thread serves runs' lanes in turn.

bench/chaos.py ``--sections cpu`` measures the same shapes against a real sidecar.
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from monitor_agent.detectors.gpu_health import GpuHealthDetector, GpuHealthSettings
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.records import schemas, wire
from monitor_agent.records.schemas import parse_record
from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.checkpoint_ledger import (
    CheckpointLedger,
    LedgerEntry,
    _fault_order,
    judge,
)
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store


def _engine(tmp_path: Path, **settings: object) -> Engine:
    return Engine(Settings(**settings), Store(tmp_path / "monitor.sqlite"),  # type: ignore[arg-type]
                  SelfMetrics(CollectorRegistry()))


def _ingest(engine: Engine, objs: list[dict], now: float = 1000.0) -> None:
    result = engine.ingest([Incoming(i, *schemas.parse_for_store(o))
                            for i, o in enumerate(objs)], now=now)
    assert not result.rejected, result.rejected[:3]


def _step(run: str, step: int, rank: int = 0, attempt: str = "a0") -> dict:
    return {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": 1000.0 + step,
            "loss": 2.0 + 0.01 * ((step * 7 + rank) % 5), "grad_norm": 1.0, "attempt": attempt,
            "step_time": 0.3, "data_time": 0.01, "compute_time": 0.2, "sync_wait_time": 0.09}


# -- the checkpoint ledger ---------------------------------------------------------------------


def test_a_checkpoint_flood_judges_each_checkpoint_once(tmp_path: Path):
    engine = _engine(tmp_path)
    n = 600
    for first in range(1, n + 1, 200):
        _ingest(engine, [rec for s in range(first, first + 200) for rec in (
            {"kind": "step", "run_id": "r", "step": s, "time": 1000.0 + s, "loss": 2.0},
            {"kind": "checkpoint", "run_id": "r", "step": s, "time": 1000.5 + s,
             "path": f"/ckpt/{s}.pt"})])
    ledger = engine.registry.get("r").state.ledger
    assert ledger.judgements == n  # one judgement an add (was n(n+1)/2 = 180,300)
    assert ledger.last_clean_step == n
    # A divergence found at 600 with its onset at 551 turns exactly 50 suspect, no more.
    assert ledger.observe(Finding("divergence", Severity.ERROR, "r", step=600, message="",
                                  evidence={"onset_step": 551}))
    assert ledger.judgements == n + 50
    assert ledger.last_clean_step == 550
    # A later one inside it turns none; an earlier stall judges only the clean ones it covers.
    assert ledger.observe(Finding("nan_inf", Severity.CRITICAL, "r", step=590, message=""))
    assert ledger.observe(Finding("stalled", Severity.ERROR, "r", step=110, message="",
                                  evidence={"onset_step": 101}))
    assert ledger.judgements == n + 50 + 10
    judged = ledger.judged()
    assert [j.status for j in judged].count("suspect") == 60
    assert judged[105].reason == "stalled from step 101 (found at step 110) was in force at step 106"
    assert judged[599].reason == ("divergence from step 551 (found at step 600) was in force "
                                  "at step 600")
    # What a page carries is a view of the ledger, not a copy of it.
    context_clean = ledger.clean_view()
    assert len(context_clean) == 540 and context_clean[-1] == (550, "/ckpt/550.pt")


def test_the_incremental_ledger_judges_as_the_rule_does():
    """Random checkpoints and faults, in any order: the ledger's judgement (statuses,
    reasons, the clean views) is ``judge`` over everything it holds, after every change."""
    types = ["nan_inf", "divergence", "stalled", "memory_pressure", "hang"]
    for seed in range(300):
        rng = random.Random(seed)
        ledger = CheckpointLedger()
        for _ in range(rng.randint(1, 30)):
            if rng.random() < 0.6:
                s = rng.randint(0, 60)
                ledger.add(LedgerEntry(s, f"/p{s}", rng.randint(0, 3), None, rng.randint(1, 3),
                                       position=rng.choice([None, 2 * s])))
            else:
                ledger.observe(Finding(
                    rng.choice(types), rng.choice([Severity.ERROR, Severity.CRITICAL,
                                                   Severity.WARNING]),
                    "r", step=rng.randint(0, 60), rank=rng.randint(0, 2), message="",
                    evidence={"onset_step": rng.randint(0, 70)} if rng.random() < 0.5 else {}))
            ref = judge(list(ledger.entries.values()), sorted(ledger.faults, key=_fault_order))
            assert [(j.entry, j.status, j.reason) for j in ledger.judged()] == [
                (j.entry, j.status, j.reason) for j in ref], seed
            clean = [j.entry for j in ref if j.status == "clean"]
            assert list(ledger.clean_view()) == [(e.step, e.path) for e in clean]
            assert dict(ledger.positions_view()) == {e.step: e.position for e in clean
                                                     if e.position is not None}
            assert ledger.last_clean_step == (clean[-1].step if clean else None)
            assert ledger.ranks() == tuple(sorted({e.rank for e in ledger.entries.values()}))


# -- resumes -----------------------------------------------------------------------------------


def _walk_back(tmp_path: Path, every: int, steps: int = 240, ranks: int = 2,
               walks: int = 25) -> tuple[Engine, list[int]]:
    engine = _engine(tmp_path, snapshot_every_steps=every)
    _ingest(engine, [{"kind": "run", "run_id": "w", "rank": r, "attempt": "a0"}
                     for r in range(ranks)])
    for first in range(1, steps + 1, 8):  # a client posting every few steps
        _ingest(engine, [_step("w", s, r) for s in range(first, first + 8)
                         for r in range(ranks)])
    replayed = []
    for k in range(1, walks + 1):  # each new attempt one step earlier than the last,
        before = engine.replayed  # a minute after the one before stopped
        _ingest(engine, [_step("w", steps - k, 0, f"walk-{k}")], now=1000.0 + 60 * k)
        replayed.append(engine.replayed - before)
    return engine, replayed


def test_a_walk_back_resume_replays_about_the_snapshot_distance(tmp_path: Path):
    every, ranks = 16, 2
    engine, replayed = _walk_back(tmp_path / "steps", every, ranks=ranks)
    # The newest snapshot below each resume is at most about twice the distance back
    # (a snapshot every 16 steps, the older ones thinned): that many steps x ranks.
    assert max(replayed) <= (2 * every + 8) * ranks, replayed
    assert engine.registry.get("w").state.last_step == 240 - 25
    # Without snapshots by step distance (none within reach), every resume replays the
    # run's whole history: what a walk-back cost before.
    _, whole = _walk_back(tmp_path / "none", every=10**9, ranks=ranks)
    assert min(whole) >= 200 * ranks, whole


def test_a_run_rebuilt_from_snapshots_taken_during_resumes_is_the_same(tmp_path: Path,
                                                                       monkeypatch):
    """The snapshots a rebuild takes as it replays restore the very state a full replay of
    the current history gives (detector state, through JSON)."""
    engine, _ = _walk_back(tmp_path, every=16, walks=12)
    live = engine.registry.get("w")
    assert live is not None and engine.registry.snapshots > 0
    from_snapshots = _comparable(live.suite.snapshot())
    # No snapshot at all: the run judged again from its whole stored current history.
    monkeypatch.setattr(engine.store, "detector_state", lambda run_id: None)
    engine.registry.evict("w")
    rebuilt = engine.registry.load("w", now=2000.0, quiet=True)
    assert _comparable(rebuilt.suite.snapshot()) == from_snapshots


def _comparable(snapshot: dict) -> bytes:
    # The GPU identity a run record gave stays in a snapshot taken before a later attempt
    # replaced that record, which a replay of the current history no longer feeds (as it
    # always was with snapshots): not part of the comparison.
    snapshot["detectors"]["gpu_health"]["extra"] = {}
    return wire.dumps(snapshot)


# -- gpu_health: the other ranks' medians ------------------------------------------------------


def test_the_throttle_check_reads_the_other_ranks_in_order_not_each_window():
    settings = GpuHealthSettings()
    det = GpuHealthDetector(settings, DetectorContext(settings))
    rng = random.Random(1)
    ranks, records = 48, 0
    for step in range(1, 41):
        for r in range(ranks):
            rec = parse_record({"kind": "step", "run_id": "r", "rank": r, "step": step,
                                "time": step, "step_time": 0.3, "data_time": 0.01,
                                "compute_time": (0.35 if r == 7 else 0.2) + 0.01 * rng.random(),
                                "gpu": {"throttle_power": 1, "utilization": 0.97,
                                        "throttle_thermal": int(r == 7)}})
            det.update(rec)
            records += 1
            peers = det._peers
            if step > settings.gpu_throttle_window and r % 11 == 0:
                # The ordered structure answers what a pass over the other ranks does.
                peers.refresh(det.ranks)
                others = [det.ranks[o] for o in det.ranks if o != r and det.ranks[o].own.full]
                assert peers.median.median_without(r) == float(
                    np.median([o.own.median() for o in others]))
                assert peers.mad.median_without(r) == float(
                    np.median([o.own.mad() for o in others]))
    # One rank brought up to date a record at most (the check ran for most of them): a
    # pass over every other rank's window was ranks - 1 of them a record.
    assert 0 < det._peers.refreshes <= records
    assert det._peers.count == ranks


# -- the engine thread: runs take turns ---------------------------------------------------------


def test_a_run_with_many_calls_queued_does_not_hold_another_runs_call_back():
    runner, order = EngineRunner(), []
    running, gate = threading.Event(), threading.Event()
    try:
        runner.submit_nowait(lambda: running.set() or gate.wait(), lane="flood")
        running.wait()
        calls = [runner.submit_nowait(order.append, f"flood-{i}", lane="flood")
                 for i in range(100)]
        calls.append(runner.submit_nowait(order.append, "victim", lane="victim"))
        assert runner.queued() == 101
        gate.set()
        for call in calls:
            call.result()
        assert order.index("victim") == 1  # after one flood call, not a hundred
        assert order[2:] == [f"flood-{i}" for i in range(1, 100)]  # each lane in order
    finally:
        runner.close()
