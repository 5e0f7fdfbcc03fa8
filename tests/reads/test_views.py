"""The views of a run the API shows: built from the store's row and the live run, and
copies that later engine work does not change under a handler's feet."""

from __future__ import annotations

from monitor_agent.reads import views as run_views
from monitor_agent.records import wire
from monitor_agent.records.types import EvalRecord, RunRecord, StepRecord
from monitor_agent.runs.run_state import RunState
from monitor_agent.storage.store import StoredRun

BUCKETS = (0.1, 1.0)


def _row(run_record: dict | None = None, status: str = "running") -> StoredRun:
    body = wire.dumps(run_record) if run_record is not None else None
    return StoredRun(run_id="r", run_record=body, status=status, first_seen=10.0,
                     last_seen=20.0, ended_at=None)


def _live() -> RunState:
    run = RunState.new("r", now=10.0)
    run.apply_run(RunRecord(run_id="r", config={"total_steps": 100},
                            labels={"project": "live-p"}))
    for step in (1, 2, 3, 4):
        run.apply_step(StepRecord(run_id="r", step=step, time=10.0 + step, loss=2.0 / step,
                                  step_time=0.5), 10.0 + step, BUCKETS)
    run.apply_eval(EvalRecord(run_id="r", step=4, time=15.0, val_loss=1.5), 15.0)
    return run


def test_a_stored_run_not_in_memory_answers_from_the_store():
    row = _row({"kind": "run", "run_id": "r", "config": {"project": "cfg-p"}}, "failed")
    listing = run_views.listing(row, None, stored_last_step=7, findings=3, attempts=1)
    assert (listing.status, listing.active, listing.last_step, listing.findings) == (
        "failed", False, 7, 3)
    summary = run_views.summary(row, None, {"warning": 2, "critical": 1}, stored_last_step=7)
    assert (summary.project, summary.last_step, summary.findings, summary.worst_finding) == (
        "cfg-p", 7, 3, "critical")
    assert summary.progress is None
    detail = run_views.detail(row, None, {"loss_spike": 1}, [b'{"type": "loss_spike"}'])
    assert detail.ranks is None and detail.last_step is None
    assert detail.run == {"kind": "run", "run_id": "r", "config": {"project": "cfg-p"}}
    assert detail.recent_findings == [{"type": "loss_spike"}]


def test_a_live_run_shows_its_ranks_progress_and_latest_values():
    live = _live()
    listing = run_views.listing(_row(), live, stored_last_step=None, findings=0, attempts=1)
    assert (listing.active, listing.last_step, listing.findings) == (True, 4, 0)
    summary = run_views.summary(_row(), live, {}, stored_last_step=None)
    assert summary.project == "live-p" and summary.last_step == 4
    assert summary.progress == 0.04 and summary.worst_finding is None
    rank = run_views.detail(_row(), live, {}, []).ranks["0"]
    assert rank["latest"]["loss"] == 0.5 and rank["val_loss"] == 1.5
    assert (rank["steps_total"], rank["progress_ratio"], rank["progress_basis"]) == (
        4, 0.04, "steps")


def test_a_detail_is_a_copy_that_later_steps_do_not_change():
    live = _live()
    detail = run_views.detail(_row(), live, {}, [])
    live.apply_step(StepRecord(run_id="r", step=5, time=16.0, loss=0.1), 16.0, BUCKETS)
    live.rank(0).last_eval = None
    assert detail.last_step == 4
    assert detail.ranks["0"]["latest"]["loss"] == 0.5 and detail.ranks["0"]["val_loss"] == 1.5
