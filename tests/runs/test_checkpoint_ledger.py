"""The checkpoint ledger (runs/checkpoint_ledger.py) through the engine and a real
SQLite store: a fault found after a save, with its onset before it, makes that save
suspect after the fact, and the judgement is the same once the run is reloaded."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.pipeline.recovery import stored_ledger
from monitor_agent.records import schemas, tokens
from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.checkpoint_ledger import CheckpointLedger, Fault, LedgerEntry, judged_dict
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


# -- the ledger's own answers, without the engine ---------------------------------------------


def _ledger(*steps: int, **positions: int) -> CheckpointLedger:
    ledger = CheckpointLedger()
    for s in steps:
        ledger.add(LedgerEntry(s, f"/ckpt/{s}.pt", rank=0, time=float(s), attempt=1,
                               position=positions.get(f"at{s}")))
    return ledger


def _found(type_: str, step: int, onset: object = None, rank: int = 0,
           layer: str | None = None) -> Finding:
    evidence = {} if onset is None else {"onset_step": onset}
    return Finding(type_, Severity.ERROR, "r", step=step, rank=rank, layer=layer, message="",
                   evidence=evidence)


def test_what_every_page_says_of_the_runs_checkpoints():
    assert CheckpointLedger().line() is None and CheckpointLedger().last_clean() is None
    ledger = _ledger(50, 60, 110, 200, 400)
    ledger.observe(_found("stalled", step=120, onset=100))  # a job fault: in force 100-120
    ledger.observe(_found("divergence", step=380, onset=300))  # the weights': 300 on
    assert ledger.last_clean() == ledger.get(200, 1)
    assert ledger.line() == "last clean checkpoint: step 200, /ckpt/200.pt"
    ledger.observe(_found("nan_inf", step=40))  # the weights' damage: every save from 40 on
    assert ledger.last_clean() is None and ledger.line() == "no clean checkpoint reported"


def test_a_checkpoint_is_looked_up_by_its_step_and_attempt():
    ledger = _ledger(50)
    assert ledger.get(50, 1) == LedgerEntry(50, "/ckpt/50.pt", 0, 50.0, 1)
    assert ledger.get(50, 2) is None and ledger.get(51, 1) is None


def test_a_fault_found_where_it_began_is_named_by_that_step_alone():
    ledger = _ledger(300, 400)
    ledger.observe(_found("nan_inf", step=300))
    assert [j.reason for j in ledger.judged()] == [
        "nan_inf from step 300 was in force at step 300",
        "nan_inf from step 300 was in force at step 400"]


def test_an_onset_the_finding_cannot_have_is_its_step():
    # Later than where it was found, not a whole step, or a JSON true: the fault begins
    # where the detector found it.
    for onset in (150, 90.0, True):
        ledger = _ledger(1, 90, 100)
        ledger.observe(_found("stalled", step=100, onset=onset))
        assert [(j.entry.step, j.status) for j in ledger.judged()] == [
            (1, "clean"), (90, "clean"), (100, "suspect")], onset
        assert ledger.judged()[2].reason == "stalled from step 100 was in force at step 100"


def test_the_same_fault_on_another_rank_or_layer_is_one_the_ledger_did_not_know():
    ledger = _ledger(100)
    assert ledger.observe(_found("grad_explosion", step=100, rank=0))
    assert not ledger.observe(_found("grad_explosion", step=100, rank=0))  # known
    assert ledger.observe(_found("grad_explosion", step=100, rank=1))
    assert ledger.observe(_found("grad_explosion", step=100, rank=1, layer="fc1"))
    assert len(ledger.faults) == 3
    # One reason, whichever of them it names: a global and a per-layer fault alike.
    assert ledger.judged()[0].reason == "grad_explosion from step 100 was in force at step 100"


def test_a_reloaded_ledger_knows_the_faults_it_was_loaded_with():
    found = [_found("grad_explosion", step=100, rank=2, layer="fc1", onset=90),
             _found("nan_inf", step=120, rank=1)]
    live = _ledger(80, 95)
    for f in found:
        live.observe(f)
    reloaded = CheckpointLedger.of([f.to_dict() for f in found], live.entries.values())
    assert reloaded.faults == live.faults
    assert not any(reloaded.observe(f) for f in found)  # fed again: nothing new to revise
    assert [(j.status, j.reason) for j in reloaded.judged()] == [
        (j.status, j.reason) for j in live.judged()]
    # A finding stored without a rank is rank 0's.
    data = {k: v for k, v in _found("nan_inf", step=120).to_dict().items() if k != "rank"}
    assert Fault.from_stored(data) == Fault("nan_inf", rank=0, onset=120, step=120)


def test_a_log_only_finding_stored_is_no_fault():
    stored = {**_found("nan_inf", step=120).to_dict(), "log_only": True}
    assert Fault.from_stored(stored) is None
    ledger = CheckpointLedger.of([stored], [LedgerEntry(130, "/ckpt/130.pt", 0, None, 1)])
    assert ledger.line() == "last clean checkpoint: step 130, /ckpt/130.pt"


def test_the_clean_views_a_page_reads():
    ledger = _ledger(50, 110, 200, at50=1600, at200=6400)
    ledger.add(LedgerEntry(110, "/ckpt/110-b.pt", rank=1, time=None, attempt=2))
    ledger.add(LedgerEntry(200, "/ckpt/200-b.pt", rank=1, time=None, attempt=2, position=6401))
    clean = ledger.clean_view()
    assert clean[:2] == ((50, "/ckpt/50.pt"), (110, "/ckpt/110.pt"))
    assert repr(clean)[:30] == "CleanView(((50, '/ckpt/50.pt')"
    positions = ledger.positions_view()
    # A step saved by two attempts counts once, with the later attempt's position; one that
    # reported none has none (not an earlier checkpoint's).
    assert list(positions) == [50, 200] and len(positions) == 2
    assert positions[200] == 6401 and 110 not in positions
    with pytest.raises(KeyError) as missing:
        positions[110]
    assert missing.value.args == (110,)


def test_a_checkpoint_as_the_api_shows_it():
    ledger = CheckpointLedger()
    ledger.add(LedgerEntry(50, "/ckpt/50.pt", rank=1, time=12.5, attempt=1, bytes=2048,
                           tag="epoch-1", position=1600))
    ledger.add(LedgerEntry(80, "/ckpt/80.pt", rank=0, time=20.0, attempt=2,
                           token="secret-token"))
    ledger.observe(_found("nan_inf", step=80))
    clean, suspect = (judged_dict(j) for j in ledger.judged())
    assert clean == {"step": 50, "path": "/ckpt/50.pt", "rank": 1, "time": 12.5,
                     "attempt": "1", "bytes": 2048, "tag": "epoch-1", "data_position": 1600,
                     "status": "clean", "reason": None}
    # The token is a write capability: its digest is shown, never the token.
    assert suspect["attempt"] == tokens.shown("secret-token") != "secret-token"
    assert (suspect["step"], suspect["status"], suspect["reason"]) == (
        80, "suspect", "nan_inf from step 80 was in force at step 80")
