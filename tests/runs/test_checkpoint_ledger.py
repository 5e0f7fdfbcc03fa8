"""The checkpoint ledger (runs/checkpoint_ledger.py) through the engine and a real
SQLite store: a fault found after a save, with its onset before it, makes that save
suspect after the fact, and the judgement is the same once the run is reloaded."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.pipeline.recovery import stored_ledger
from monitor_agent.records import schemas
from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.checkpoint_ledger import CheckpointLedger, Fault, LedgerEntry
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store


def _ingest(engine: Engine, objs: list[dict]) -> None:
    items = [Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(objs)]
    result = engine.ingest(items, now=1000.0)
    assert not result.rejected, result.rejected


def test_a_fault_found_after_a_save_with_an_earlier_onset_makes_it_suspect(tmp_path: Path):
    store = Store(tmp_path / "monitor.sqlite")
    engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
    _ingest(engine, [{"kind": "step", "run_id": "r", "step": s, "time": float(s), "loss": 2.0}
                     for s in range(1, 121)]
            + [{"kind": "checkpoint", "run_id": "r", "step": s, "time": s + 0.5,
                "path": f"/ckpt/{s}.pt"} for s in (80, 100)])
    run = engine.registry.get("r").state
    assert [(j.entry.step, j.status) for j in run.ledger.judged()] == [
        (80, "clean"), (100, "clean")]
    # A divergence found at 115 whose signal left its band at 90 (the detectors' evidence).
    late = Finding("divergence", Severity.ERROR, "r", step=115, message="diverged",
                   evidence={"onset_step": 90})
    assert run.ledger.observe(late)
    store.insert_findings([late.to_dict()])
    judged = run.ledger.judged()
    assert [(j.entry.step, j.status) for j in judged] == [(80, "clean"), (100, "suspect")]
    assert judged[1].reason == "divergence from step 90 (found at step 115) was in force at step 100"
    assert run.ledger.last_clean_step == 80
    # The same from the store alone (a restart, or the run out of memory).
    reloaded = stored_ledger(store, "r")
    assert [(j.entry.step, j.status, j.reason) for j in reloaded.judged()] == [
        (j.entry.step, j.status, j.reason) for j in judged]
    # A warning never makes a save suspect: only what pages does.
    assert not run.ledger.observe(Finding("loss_spike", Severity.WARNING, "r", step=70,
                                          message="spike"))
    store.close()


def test_a_crash_after_a_save_leaves_the_save_clean():
    """Issue 45: a crash pages, but the process died after its last step: the checkpoint
    saved at that step is as good as it was (a rollback or a relaunch may take it)."""
    ledger = CheckpointLedger()
    ledger.add(LedgerEntry(59, "/ckpt/59.pt", rank=0, time=0.0, attempt=1))
    crash = Finding("crashed", Severity.ERROR, "r", step=59, message="the run crashed",
                    evidence={"exception": "RuntimeError"})
    assert not ledger.observe(crash)
    assert [(j.entry.step, j.status) for j in ledger.judged()] == [(59, "clean")]
    assert Fault.from_stored(crash.to_dict()) is None
