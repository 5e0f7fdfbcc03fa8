"""A run's lifecycle as one state machine: its phases and the events consumers get."""

from __future__ import annotations

from monitor_agent.records.actions import Action
from monitor_agent.runs.lifecycle import (
    AttemptSettled,
    Ended,
    Phase,
    RollbackDecided,
    RolledBack,
    RunLifecycle,
    StopRequested,
)
from monitor_agent.storage.store import StoredAttempt

PLAN = {"checkpoint_step": 300, "checkpoint_path": "/c/300.pt", "skip_from": 301,
        "skip_to": 545}


def _rollback(action_id: int = 1, **plan: int) -> dict:
    return {"id": action_id, "action": "rollback", "step": 345, "plan": {**PLAN, **plan}}


def _actions(*decided: dict) -> list[Action]:
    """The actions as the run's leader serves them (their JSON, read back)."""
    return [Action.parse(a, "r") for a in decided]


def test_a_rollback_is_awaited_until_an_attempt_resumes_at_or_before_its_window():
    life = RunLifecycle()
    [decided] = life.acted(_actions(_rollback()))
    assert isinstance(decided, RollbackDecided) and life.phase is Phase.AWAITING_RESUME
    too_late = StoredAttempt(2, "resumed", 320, 0.0, 320, 350)
    assert [type(e) for e in life.settled(too_late)] == [AttemptSettled]
    assert life.phase is Phase.AWAITING_RESUME  # resumed past the window: not this plan
    resumed = StoredAttempt(3, "resumed", 301, 0.0, 301, 350)
    assert [type(e) for e in life.settled(resumed)] == [AttemptSettled, RolledBack]
    assert life.phase is Phase.RUNNING


def test_an_honoured_action_read_back_is_history_not_an_order():
    life = RunLifecycle()
    assert life.acted(_actions({**_rollback(), "honoured_step": 301})) == []
    assert life.phase is Phase.RUNNING


def test_a_stop_is_honoured_only_by_a_stopped_end():
    life = RunLifecycle()
    [stop] = life.acted(_actions({"id": 2, "action": "stop", "step": 40}))
    assert isinstance(stop, StopRequested) and life.describe() == \
        "stopping: stop 2 requested at step 40"
    # It ran on to its end: a stop it never honoured, said so (not "stopped").
    assert life.ended("completed", 90) == [Ended("completed", 90, stop_honoured=False,
                                                 stop_ignored=True)]
    again = RunLifecycle()
    again.acted(_actions({"id": 2, "action": "stop", "step": 40}))
    assert again.ended("stopped", 42) == [Ended("stopped", 42, stop_honoured=True)]
    assert again.phase is Phase.ENDED and again.describe() == "stopped"


def test_a_new_attempt_makes_an_ended_run_running_again():
    life = RunLifecycle(status="failed")
    assert life.phase is Phase.ENDED
    restarted = StoredAttempt(2, "restarted", 1, 0.0, 1, 500)
    assert [type(e) for e in life.settled(restarted)] == [AttemptSettled]
    assert life.status == "running" and life.phase is Phase.RUNNING


def test_a_silent_run_is_said_so_until_it_is_heard_from():
    from monitor_agent.runs.lifecycle import Silent

    life = RunLifecycle()
    [silent] = life.went_silent(400, 300.0)
    assert isinstance(silent, Silent) and life.phase is Phase.SILENT
    assert life.describe() == ("silent since step 400: nothing for over 5 min, no end record; "
                               "its process most likely died (killed, or crashed without a word)")
    assert life.went_silent(400, 300.0) == []  # told once
    assert life.went_silent(400, 120.0, gone=True)  # the watchdogs' word is stronger
    life.heard()
    assert life.phase is Phase.RUNNING
    life.ended("completed", 500)
    assert life.went_silent(500, 300.0) == [] and life.phase is Phase.ENDED
