"""Recovery reads the store and fills a run; the engine replays the tail itself, so
recovery never imports the engine (no engine <-> recovery cycle)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from monitor_agent.detectors import DetectorSuite
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import recovery
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import StepRecord
from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import RecordRow, Store


def _step(step: int, loss: float = 1.0) -> dict:
    return {"kind": "step", "run_id": "r", "step": step, "time": float(step), "loss": loss}


def _ingest(engine: Engine, objs: list[dict], now: float) -> None:
    engine.ingest([Incoming(i, *schemas.parse_for_store(o)) for i, o in enumerate(objs)], now)


def test_recovery_does_not_import_the_engine():
    tree = ast.parse(Path(recovery.__file__).read_text())
    imported = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module or "" for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom)}
    assert not any(name.startswith("monitor_agent.pipeline.engine") for name in imported)


def test_a_run_never_stored_restores_to_nothing():
    store = Store(":memory:")
    run = RunState.new("ghost", 0.0)
    assert recovery.restore_run(store, run, DetectorSuite(), now=0.0) is None
    assert list(recovery.stored_tail(store, "ghost", 0)) == []


def test_the_tail_after_the_snapshot_replays_and_a_bad_row_is_skipped(tmp_path: Path):
    settings = load_settings(data_dir=tmp_path)
    store = Store(tmp_path / "m.sqlite")
    engine = Engine(settings, store, SelfMetrics(CollectorRegistry()))
    _ingest(engine, [_step(s) for s in range(1, 6)], now=10.0)
    engine.registry.snapshot_all()
    _ingest(engine, [_step(s) for s in range(6, 9)], now=11.0)
    # A row an older version stored that today's rules refuse: skipped, not fatal.
    bad = RecordRow(run_id="r", rank=0, kind="step", step=9, time=9.0,
                    body=wire.dumps({"kind": "step", "run_id": "r", "step": -9, "time": 9.0}))
    store.insert_records([bad])

    run = RunState.new("r", 12.0)
    after = recovery.restore_run(store, run, DetectorSuite(settings.detectors), now=12.0)
    assert after is not None and after == run.snapshot_record_id > 0
    assert run.ranks[0].last_step == 5  # from the snapshot, before the tail
    tail = list(recovery.stored_tail(store, "r", after))
    assert [row.record.step for row in tail] == [6, 7, 8]
    assert all(isinstance(row.record, StepRecord) for row in tail)

    again = Engine(settings, store, SelfMetrics(CollectorRegistry()))
    assert again.recover(now=12.0) == 1
    assert again.registry.get("r").state.ranks[0].last_step == 8  # the engine replayed the tail
    assert again.registry.get("r").state.last_record_id == tail[-1][0]
    store.close()


def _resume_run(token: str, first: int, last: int) -> list[dict]:
    return [{"kind": "step", "run_id": "r", "step": s, "time": 1000.0 + s, "attempt": token,
             "loss": 2.0} for s in range(first, last + 1)]


def test_a_restart_feeds_the_goodput_ledger_the_replaced_records_stored_since_it_was_kept(
        tmp_path: Path):
    """The ledger is kept with the snapshots, here after step 325 of an attempt that goes on
    to 330; a resume from step 251 replaces 251-330, and the sidecar is killed once its
    first batch is stored. The detectors' replay feeds only the current history: the
    restarted ledger must still see steps 326-330, or it charges 75 s to the resume where
    the sidecar never killed charged 80 s (tests/e2e/test_rollback_history.py)."""
    reports = []
    for kill in (False, True):
        settings = load_settings(data_dir=tmp_path / str(kill), snapshot_every_steps=100_000)
        store = Store(tmp_path / f"{kill}.sqlite")
        engine = Engine(settings, store, SelfMetrics(CollectorRegistry()))
        for first in range(1, 326, 25):
            _ingest(engine, _resume_run("a", first, first + 24), now=10.0)
        engine.registry.snapshot_all()
        _ingest(engine, _resume_run("a", 326, 330), now=11.0)
        # The resume comes after attempt a stopped (a relaunch takes its time).
        _ingest(engine, _resume_run("b", 251, 275), now=72.0)
        if kill:  # SIGKILL: nothing more kept; a new process on the same database
            engine = Engine(settings, store, SelfMetrics(CollectorRegistry()))
            assert engine.recover(now=73.0) == 1
            _ingest(engine, _resume_run("b", 251, 275), now=73.0)  # its answer was lost
        for first in range(276, 451, 25):
            _ingest(engine, _resume_run("b", first, first + 24), now=74.0)
        reports.append(engine.registry.get("r").state.goodput.report())
        store.close()
    plain, killed = reports
    assert plain.badput["resume"] == pytest.approx(80.0)
    assert killed == plain
