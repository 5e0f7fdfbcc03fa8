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


POSITIONED = {**PLAN, "skip": [[301, 545]], "resume_position": 2400, "positions": "positions"}


def _restart(action_id: int = 5, created_at: float = 100.0) -> dict:
    plan = {"cause": "hang", "fault_step": 40, "ranks": 2, "checkpoint_step": 30,
            "checkpoint_path": "/c/30.pt"}
    return {"id": action_id, "action": "restart", "step": 40, "created_at": created_at,
            "message": "restart (rule Hang)", "plan": plan}


def test_a_rollback_decided_carries_its_plan_and_is_served_until_applied():
    life = RunLifecycle()
    [rollback] = _actions({**_rollback(), "plan": POSITIONED})
    assert life.acted([rollback]) == [RollbackDecided(
        1, checkpoint_step=300, checkpoint_path="/c/300.pt", skip_from=301, decided_at_step=345,
        skip=((301, 545),), resume_position=2400, unit="positions")]
    assert life.open_actions() == [rollback]  # every rank's next answer carries it
    assert life.describe() == ("awaiting resume from checkpoint step 300 (/c/300.pt), "
                               "rollback 1 decided at step 345")
    resumed = StoredAttempt(2, "resumed", 301, 0.0, 301, 350)
    # The plan applied is what the resumed run's data positions are checked against.
    applied = RolledBack(1, start_step=301, skip=((301, 545),), resume_position=2400,
                         unit="positions")
    assert life.settled(resumed) == [AttemptSettled(resumed), applied]
    assert life.applied == applied and life.open_actions() == []
    assert life.resume_kind(resumed, before_ended=None) == "rollback"


def test_a_first_attempt_begins_the_run_and_settles_nothing_pending():
    life = RunLifecycle()
    life.acted(_actions({"id": 2, "action": "stop", "step": 40}))
    first = StoredAttempt(1, "first", 1, 0.0, None, None)
    assert life.settled(first) == [AttemptSettled(first)]
    assert life.phase is Phase.STOPPING  # its own process still has the stop to honour


def test_a_resumed_attempt_ends_the_stop_of_the_process_before_it():
    life = RunLifecycle()
    [stop] = _actions({"id": 2, "action": "stop", "step": 40})
    life.acted([stop])
    assert life.open_actions() == [stop]
    life.settled(StoredAttempt(2, "resumed", 30, 0.0, 30, 40))
    assert life.phase is Phase.RUNNING and life.open_actions() == []


def test_a_stopped_end_takes_the_stop_out_of_the_answers_and_a_later_resume_runs():
    life = RunLifecycle()
    life.acted(_actions({"id": 2, "action": "stop", "step": 40}))
    life.ended("stopped", 42)
    assert life.open_actions() == []
    life.settled(StoredAttempt(2, "resumed", 40, 0.0, 40, 42))
    assert life.phase is Phase.RUNNING and life.describe() == "running"


def test_a_failed_end_leaves_the_stop_standing_for_the_ranks_still_sending():
    life = RunLifecycle()
    [stop] = _actions({"id": 2, "action": "stop", "step": 40})
    life.acted([stop])
    assert life.ended("failed", 41) == [Ended("failed", 41, stop_honoured=False)]
    assert life.open_actions() == [stop]  # neither honoured nor ignored: still an order
    assert life.phase is Phase.ENDED and life.describe() == "failed"


def test_a_checkpoint_action_is_not_an_order_the_run_waits_on():
    life = RunLifecycle()
    assert life.acted(_actions({"id": 3, "action": "checkpoint", "step": 50})) == []
    assert life.phase is Phase.RUNNING and life.open_actions() == []


def test_applied_rollbacks_read_back_on_load_are_history_the_newest_applied():
    older = {**_rollback(1), "honoured_step": 301}
    newer = {**_rollback(3, skip_from=701, skip_to=760), "honoured_step": 700,
             "plan": {**POSITIONED, "skip_from": 701, "skip_to": 760,
                      "skip": [[301, 545], [701, 760]]}}
    stop = {"id": 4, "action": "stop", "step": 800}
    for order in ((older, newer), (newer, older)):  # whatever order they are read in
        life = RunLifecycle()
        # An applied plan and a stop honoured are history; the open stop after them is not.
        events = life.acted(_actions(*order, {**stop, "id": 2, "honoured_step": 90}, stop))
        assert events == [StopRequested(4, 800)]
        assert life.applied == RolledBack(3, start_step=700, skip=((301, 545), (701, 760)),
                                          resume_position=2400, unit="positions")
        assert life.phase is Phase.STOPPING


def test_what_a_resumed_attempt_was():
    life = RunLifecycle()
    life.acted(_actions({**_rollback(1), "honoured_step": 301}))
    at = StoredAttempt(4, "resumed", 301, 0.0, 301, 350)
    elsewhere = StoredAttempt(5, "resumed", 500, 0.0, 500, 520)
    assert life.resume_kind(at, before_ended="stopped") == "rollback"  # it applied a plan
    assert life.resume_kind(elsewhere, before_ended=None) == "crash"  # no end record: killed
    assert life.resume_kind(elsewhere, before_ended="failed") == "crash"
    assert life.resume_kind(elsewhere, before_ended="completed") == "resume"
    assert life.resume_kind(elsewhere, before_ended="stopped") == "resume"
    unplaced = StoredAttempt(6, "resumed", None, 0.0, None, None)
    assert life.resume_kind(unplaced, before_ended="stopped") == "resume"


def test_a_crash_resume_keeps_the_applied_plan_and_a_restarted_run_drops_it():
    life = RunLifecycle()
    life.acted(_actions({**_rollback(1), "honoured_step": 301}))
    crash = StoredAttempt(4, "resumed", 400, 0.0, 400, 450)
    life.settled(crash)  # the same run goes on: its data still skips the window
    assert life.applied is not None and life.applied.action_id == 1
    assert life.resume_kind(StoredAttempt(3, "resumed", 301, 0.0, 301, 350), None) == "rollback"
    life.settled(StoredAttempt(5, "restarted", 1, 0.0, 1, 450))  # a new run reusing the id
    assert life.applied is None
    assert life.resume_kind(StoredAttempt(3, "resumed", 301, 0.0, 301, 350), None) == "crash"


def test_a_withdrawn_rollback_is_no_longer_awaited_or_served():
    life = RunLifecycle()
    life.acted(_actions(_rollback(1)))
    life.withdrawn(7)  # another plan's: this one stands
    assert life.phase is Phase.AWAITING_RESUME
    life.withdrawn(1)
    assert life.phase is Phase.RUNNING and life.open_actions() == []
    life.withdrawn(1)  # told again (the job refused it, then the revision came): no-op
    assert life.phase is Phase.RUNNING


def test_a_revised_plan_read_back_replaces_the_withdrawn_one():
    life = RunLifecycle()
    life.acted(_actions(_rollback(1)))
    # The leader withdrew plan 1 for plan 2 (its checkpoint turned suspect), then decided a
    # stop: a node sidecar adopting them serves plan 2 and the stop, not plan 1.
    revised = _actions({**_rollback(1), "withdrawn_by": 2}, _rollback(2, checkpoint_step=200),
                       {"id": 3, "action": "stop", "step": 346})
    events = life.acted(revised)
    assert [type(e) for e in events] == [RollbackDecided, StopRequested]
    assert [a.id for a in life.open_actions()] == [2, 3]
    assert life.describe().startswith("awaiting resume from checkpoint step 200")


def test_a_withdrawn_plan_never_seen_pending_is_no_order():
    life = RunLifecycle()
    assert life.acted(_actions({**_rollback(1), "withdrawn_by": 2})) == []
    assert life.phase is Phase.RUNNING and life.open_actions() == []


def test_a_rollback_pending_when_the_process_ends_waits_for_its_relaunch():
    life = RunLifecycle()
    life.acted(_actions(_rollback()))
    life.ended("stopped", 346)
    assert life.phase is Phase.AWAITING_RELAUNCH
    assert life.describe() == ("waiting for relaunch from checkpoint step 300 (/c/300.pt): "
                               "rollback 1 decided at step 345")


def test_a_restart_is_awaited_until_an_attempt_begun_after_it_settles():
    from monitor_agent.runs.lifecycle import RestartDecided, Restarted

    life = RunLifecycle()
    [restart] = _actions(_restart())
    assert life.acted([restart]) == [RestartDecided(
        5, decided_at_step=40, said="restart all 2 ranks from checkpoint 30 (clean; /c/30.pt)",
        decided_at=100.0)]
    assert life.phase is Phase.RESTARTING and life.open_actions() == [restart]
    assert life.describe() == ("restarting: restart all 2 ranks from checkpoint 30 (clean; "
                               "/c/30.pt); restart 5 decided at step 40")
    life.went_silent(40, 300.0)  # its ranks left on purpose: still restarting
    assert life.phase is Phase.RESTARTING
    # The launcher's own relaunch, begun before the decision, does not carry it out.
    early = StoredAttempt(2, "restarted", 31, 99.0, 31, 40)
    assert life.settled(early) == [AttemptSettled(early)]
    assert life.phase is Phase.RESTARTING
    life.ended("failed", 40)  # every rank left: the run reads as ended meanwhile
    assert life.phase is Phase.ENDED and life.describe() == "failed"
    relaunched = StoredAttempt(3, "restarted", 31, 100.0, 31, 40)  # begun as it was decided
    assert life.settled(relaunched) == [AttemptSettled(relaunched), Restarted(5, 31)]
    assert life.phase is Phase.RUNNING and life.open_actions() == []


def test_a_restart_from_the_start_resumes_at_the_runs_first_step_even_step_0():
    from monitor_agent.runs.lifecycle import Restarted

    life = RunLifecycle()
    life.acted(_actions(_restart()))
    relaunched = StoredAttempt(2, "restarted", 0, 200.0, 0, 40)
    assert life.settled(relaunched)[1:] == [Restarted(5, 0)]


def test_a_restart_whose_plan_did_not_parse_is_said_by_its_message():
    from monitor_agent.records.actions import RESTART_ACTIONS

    for kind in RESTART_ACTIONS:
        life = RunLifecycle()
        # What the alert database reads back for a stored plan that does not parse.
        life.acted([Action(6, "r", kind, "Hang", "hang", step=40, message="restart (rule Hang)",
                           created_at=100.0)])
        assert life.describe() == "restarting: restart (rule Hang); restart 6 decided at step 40"


def test_a_silent_run_says_how_long_and_why():
    life = RunLifecycle()
    life.went_silent(400, 90.0, gone=True)
    assert life.describe() == ("silent since step 400: nothing for over 90 s, no end record; "
                               "its ranks' watchdogs did not report a hang: the process is gone")
    for seconds, said in ((120.0, "2 min"), (3600.0, "60 min")):
        life = RunLifecycle()
        life.went_silent(400, seconds)
        assert f"nothing for over {said}," in life.describe()


def test_an_end_record_ends_the_silence_for_the_run_that_resumes():
    life = RunLifecycle()
    life.went_silent(400, 300.0)
    life.ended("failed", 400)
    life.settled(StoredAttempt(2, "resumed", 380, 0.0, 380, 400))
    assert life.phase is Phase.RUNNING


def test_a_run_awaiting_its_resume_that_goes_silent_is_said_silent():
    life = RunLifecycle()
    life.acted(_actions(_rollback()))
    life.went_silent(345, 300.0)  # no process came back to take the plan: likely dead
    assert life.phase is Phase.SILENT
    assert life.describe().startswith("silent since step 345: nothing for over 5 min")
