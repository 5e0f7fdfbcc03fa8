"""hang: the client's hang reports gathered per rank, judged on an injected clock; a rank
silent with no report is a process that is gone."""

from __future__ import annotations

import dataclasses

from synth_records import DT, T0, assert_restore_equivalent, feed, only, step

from monitor_agent.detectors.hang import GONE, HUNG
from monitor_agent.records import wire
from monitor_agent.records.types import (
    EndRecord,
    EvalRecord,
    HangRecord,
    RunRecord,
    WatchdogDeclaration,
)

ALL_REDUCE = ("torch/distributed/distributed_c10d.py", "all_reduce", 3252)


def _run(watchdog: bool = True) -> RunRecord:
    return RunRecord(run_id="r", time=T0, hardware={"world_size": 4},
                     watchdog=WatchdogDeclaration(floor_seconds=30.0, factor=5.0) if watchdog else None)


def _hang(rank: int, at: int, where: tuple[str, str, int] = ALL_REDUCE,
          stuck: float = 40.0) -> HangRecord:
    file, fn, line = where
    frames = ({"file": "train.py", "line": 88, "function": "main", "user": True},
              {"file": file, "line": line, "function": fn, "user": file == "train.py"})
    return HangRecord(run_id="r", step=at, time=T0 + at * DT + stuck, stuck_seconds=stuck,
                      rank=rank, limit_seconds=30.0, phase="backward",
                      threads=({"name": "MainThread", "training": True, "frames": frames},))


def _steps(ranks: range, upto: int) -> list:
    return [step(i, rank=r) for i in range(1, upto + 1) for r in ranks]


def test_one_rank_elsewhere_is_named_with_its_frame_and_the_rest_wait():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 20)])
    feed(suite, [_hang(0, 20), _hang(1, 20), _hang(3, 20),
                 _hang(2, 20, ("data/loader.py", "next_batch", 12))])
    last = T0 + 20 * DT
    found = suite.tick(last + 41.0)
    assert [f.type for f in found] == ["hang"]
    f = found[0]
    assert f.rank == 2 and f.step == 20
    assert f.message.startswith("rank 2 stuck 40 s in data/loader.py:next_batch at line 12, "
                                "called from train.py:88; ranks 0-1,3 wait in "
                                "torch/distributed/distributed_c10d.py:all_reduce at line 3252")
    assert f.evidence["ranks"]["2"]["stuck_line"] == 12
    assert f.evidence["ranks"]["2"]["phase"] == "backward"
    assert f.evidence["hung_ranks"] == [0, 1, 2, 3] and f.evidence["gone_ranks"] == []
    # pages once: nothing new until the repeat interval, which keeps the alert open
    assert suite.tick(last + 42.0) == []
    assert len(suite.tick(last + 41.0 + 61.0)) == 1


def test_ranks_stuck_at_different_lines_of_one_function_are_named_without_a_line():
    """The line is named when it is the one every rank named there is stuck at."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 20)])
    feed(suite, [_hang(r, 20, ("train.py", "train", 100 + r % 2)) for r in range(4)])
    [found] = suite.tick(T0 + 20 * DT + 41.0)
    assert found.message.startswith("ranks 0-3 stuck 40 s in train.py:train, called from "
                                    "train.py:88 "), found.message
    assert [found.evidence["ranks"][str(r)]["stuck_line"] for r in range(4)] == [100, 101] * 2


def test_waits_for_the_other_ranks_reports_before_judging():
    suite = only("hang", hang_settle_seconds=15.0)
    feed(suite, [_run(watchdog=False), *_steps(range(4), 20)])
    feed(suite, [_hang(0, 20)])
    report = T0 + 20 * DT + 40.0
    assert suite.tick(report + 1.0) == []           # ranks 1-3 may still report
    feed(suite, [_hang(r, 20) for r in (1, 2, 3)])
    found = suite.tick(report + 2.0)                 # every rank accounted for
    assert [f.evidence["hung_ranks"] for f in found] == [[0, 1, 2, 3]]
    assert found[0].message.startswith("ranks 0-3 stuck 40 s in "
                                       "torch/distributed/distributed_c10d.py:all_reduce")


def test_judges_after_the_settle_time_when_the_others_still_step():
    suite = only("hang", hang_settle_seconds=15.0)
    feed(suite, [_run(), *_steps(range(2), 20)])
    feed(suite, [_hang(0, 20)])
    report = T0 + 20 * DT + 40.0
    feed(suite, [dataclasses.replace(step(i, rank=1), time=report - 20.0 + i)
                 for i in range(21, 35)])
    assert suite.tick(report + 1.0) == []
    found = suite.tick(report + 16.0)
    assert [f.evidence["hung_ranks"] for f in found] == [[0]]


def test_a_step_after_the_hang_ends_it():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(2), 20)])
    feed(suite, [_hang(0, 20), _hang(1, 20)])
    assert len(suite.tick(T0 + 20 * DT + 41.0)) == 1
    feed(suite, [step(21, rank=0), step(21, rank=1)])
    assert suite.tick(T0 + 21 * DT + 45.0) == []   # within their watchdogs' limit x 2


def test_a_rank_silent_without_a_report_is_gone_while_its_peers_wait():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 20), *_steps(range(3), 21)[60:]])
    feed(suite, [_hang(r, 21) for r in range(3)])
    silent_since = T0 + 20 * DT  # rank 3's last step
    assert suite.tick(silent_since + 59.0) == []      # within 2 x its watchdog's 30 s
    found = suite.tick(silent_since + 61.0)
    assert len(found) == 1
    f = found[0]
    assert f.rank == 3 and f.evidence["gone_ranks"] == [3]
    assert f.message.startswith("rank 3 sent nothing for 61 s and no hang report: its process "
                                "is gone (killed or crashed); ranks 0-2 wait 40 s in "
                                "torch/distributed/distributed_c10d.py:all_reduce")
    assert "stuck_in" not in f.evidence["ranks"]["3"]


def _ticks(suite, start: float, end: float) -> list:
    """The sidecar's clock: a tick every second from ``start`` to ``end``; what was found."""
    found, now = [], start
    while now <= end:
        found += [(now, f) for f in suite.tick(now)]
        now += 1.0
    return found


def test_a_frozen_rank_whose_peers_reported_is_gone_at_their_limit_plus_the_delivery():
    """SIGSTOP of rank 3: its last records (the sender's batch) stop three steps before its
    peers', who hang in the collective and report at their 30 s limit plus a wake-up. The
    peers' limit is measured, so rank 3 is judged by it plus gone_factor x (the wake-up +
    the reports' delay), not at 2 x the limit."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(3), 21), *_steps(range(3, 4), 18)])
    last3 = T0 + 18 * DT
    assert _ticks(suite, T0 + 21 * DT, T0 + 21 * DT + 30.0) == []   # no reports yet
    feed(suite, [_hang(r, 21, stuck=30.5) for r in range(3)])
    found = _ticks(suite, T0 + 21 * DT + 30.6, last3 + 60.0)
    assert found, "rank 3 is never judged"
    when, f = found[0]
    assert f.evidence["gone_ranks"] == [3] and f.evidence["hung_ranks"] == [0, 1, 2]
    # the reports were seen 0.1 s after they were sent: 30 + 2 x (1 + 0.1) = 32.2 s
    assert 32.2 < when - last3 < 33.2


def test_a_rank_at_the_peers_pace_is_not_gone_before_its_own_report_could_arrive():
    """Rank 3 stepped with its peers to the step they are stuck after and is alive: its
    report comes at the same limit a second later, within the margin; never gone."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 21)])
    stuck_from = T0 + 21 * DT
    feed(suite, [_hang(r, 21, stuck=30.2) for r in range(3)])
    assert _ticks(suite, stuck_from + 30.3, stuck_from + 31.3) == []
    feed(suite, [_hang(3, 21, stuck=31.2)])
    [(_, f)] = _ticks(suite, stuck_from + 32.0, stuck_from + 32.0)
    assert f.evidence["gone_ranks"] == [] and f.evidence["hung_ranks"] == [0, 1, 2, 3]


def test_reports_seen_late_widen_the_margin():
    """The peers' reports reached the detector 6 s after they were sent (a slow forward):
    a live rank's would be as late, so rank 3 is judged only past 30 + 2 x (1 + 6) s."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 21)])
    stuck_from = T0 + 21 * DT
    feed(suite, [_hang(r, 21, stuck=30.5) for r in range(3)])
    found = _ticks(suite, stuck_from + 36.5, stuck_from + 60.0)
    assert found and found[0][1].evidence["gone_ranks"] == [3]
    assert found[0][0] - stuck_from > 30 + 2 * (1 + 6.0)


def test_a_relaunched_rank_not_heard_yet_is_starting_not_gone():
    """After a restart the other rank's new process may report first: the silent one's
    silence counts from the new attempt's start, not from its old process's last step."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(2), 20)])
    began = T0 + 20 * DT + 300.0  # the relaunched job's first record, minutes later
    suite.ctx.attempt_began = began
    feed(suite, [dataclasses.replace(step(11, rank=1), time=began)])
    assert suite.tick(began + 1.0) == []
    feed(suite, [dataclasses.replace(step(12 + i, rank=1), time=began + i) for i in range(61)])
    found = suite.tick(began + 61.0)  # still nothing from rank 0: gone now
    assert [f.evidence["gone_ranks"] for f in found] == [[0]]


def test_a_silent_rank_the_others_wait_for_is_named_even_when_its_limit_is_longer():
    """Rank 3 steps 4x slower than the rest (its watchdog's limit is 4x theirs) and is killed
    after step 20; ranks 0-2 hang in the collective of step 21. Settling at the others'
    pace would page without it; the page waits until it is judged gone."""
    suite = only("hang", hang_settle_seconds=15.0)
    slow = 4 * DT * 10
    last = T0 + 20 * DT
    feed(suite, [_run(), *_steps(range(3), 20),
                 *[dataclasses.replace(step(i, rank=3), time=last - (20 - i) * slow)
                   for i in range(1, 21)]])
    limit = max(30.0, 5.0 * slow)  # the run's declared watchdog at rank 3's pace
    assert limit > 40.0 + 15.0
    feed(suite, [_hang(r, 20) for r in range(3)])
    assert suite.tick(last + 40.0 + 16.0) == []      # settled at the others' pace: too soon
    assert suite.tick(last + 2 * limit - 1.0) == []
    [found] = suite.tick(last + 2 * limit + 1.0)
    assert found.evidence["gone_ranks"] == [3] and found.evidence["hung_ranks"] == [0, 1, 2]


def test_without_a_declared_watchdog_or_reports_silence_is_left_to_stalled():
    suite = only("hang")
    feed(suite, [_run(watchdog=False), *_steps(range(2), 20)])
    assert suite.tick(T0 + 10**6) == []


def test_a_single_rank_run_with_a_watchdog_that_falls_silent_is_gone():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(1), 20)])
    found = suite.tick(T0 + 20 * DT + 61.0)
    assert [f.evidence["gone_ranks"] for f in found] == [[0]]


def test_snapshot_and_restore_keep_the_reports():
    recs = [_run(), *_steps(range(4), 20), _hang(0, 20), _hang(1, 20), _hang(2, 20)]
    assert_restore_equivalent(lambda: only("hang"), recs, cut=len(recs) - 1,
                              final_tick=T0 + 20 * DT + 100.0)


def _report(rank: int, at: int, frames: tuple[dict, ...], stuck: float = 40.0,
            limit: float | None = 30.0, **fields) -> HangRecord:
    """A hang report with these frames of the training thread (outermost first)."""
    return HangRecord(run_id="r", step=at, time=T0 + at * DT + stuck, stuck_seconds=stuck,
                      rank=rank, limit_seconds=limit, phase="backward",
                      threads=({"name": "MainThread", "training": True, "frames": frames},),
                      **fields)


def _restored(suite):
    """The suite as a restarted sidecar has it: its snapshot through the wire format."""
    back = only("hang")
    back.restore(wire.loads(wire.dumps(suite.snapshot())))
    return back


MAIN = {"file": "train.py", "line": 88, "function": "main", "user": True}


def test_a_rank_stuck_in_its_first_step_without_a_python_stack_is_hung():
    suite = only("hang")
    feed(suite, [_run(), _report(0, 0, ())])
    [f] = suite.tick(T0 + 41.0)
    assert f.message == ("rank 0 stuck 40 s in an unknown frame (no Python stack) (last "
                         "completed step 0)")
    assert f.evidence["ranks"] == {"0": {
        "state": "hung", "last_step": 0, "stuck_seconds": 40.0, "phase": "backward",
        "stuck_in": "an unknown frame (no Python stack)", "stuck_line": 0, "called_from": ""}}
    assert (f.evidence["stuck_in"], f.evidence["called_from"]) == (
        "an unknown frame (no Python stack)", "")


def test_the_stuck_frame_is_the_innermost_and_called_from_the_innermost_of_the_script():
    suite = only("hang")
    frames = (MAIN, {"file": "train.py", "line": 120, "function": "train_step", "user": True},
              {"file": "torch/nn/modules/module.py", "line": 1527, "function": "_call"})
    feed(suite, [_run(), *_steps(range(1), 20),
                 _report(0, 20, frames, nccl_trace="pg 0: allreduce seq 812 pending")])
    now = T0 + 20 * DT + 41.0
    [f] = suite.tick(now)
    assert f.message == ("rank 0 stuck 40 s in torch/nn/modules/module.py:_call at line 1527, "
                         "called from train.py:120 (last completed step 20)")
    assert f.evidence["ranks"]["0"] == {
        "state": "hung", "last_step": 20, "stuck_seconds": 40.0, "phase": "backward",
        "stuck_in": "torch/nn/modules/module.py:_call", "stuck_line": 1527,
        "called_from": "train.py:120", "nccl_trace": "pg 0: allreduce seq 812 pending"}
    assert (f.evidence["stuck_in"], f.evidence["called_from"]) == (
        "torch/nn/modules/module.py:_call", "train.py:120")
    assert (f.run_id, f.time, f.value, f.threshold, f.suggestions) == ("r", now, 1.0, None,
                                                                      HUNG)


def test_a_stack_without_the_scripts_frames_or_a_line_is_named_without_them():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(1), 20),
                 _report(0, 20, ({"file": "torch/cuda/__init__.py", "line": None,
                                  "function": "synchronize"},))])
    [f] = suite.tick(T0 + 20 * DT + 41.0)
    assert f.message == ("rank 0 stuck 40 s in torch/cuda/__init__.py:synchronize (last "
                         "completed step 20)")
    assert "nccl_trace" not in f.evidence["ranks"]["0"]


def test_two_ranks_in_different_frames_name_the_odd_one_and_the_one_waiting():
    """A tie: the lowest rank's frame is the common one; the other rank, its stack with no
    frame of the script's own, is named with no caller."""
    suite = only("hang")
    loader = ({"file": "data/loader.py", "line": 12, "function": "next_batch"},)
    feed(suite, [_run(), *_steps(range(2), 20), _hang(0, 20), _report(1, 20, loader)])
    [f] = suite.tick(T0 + 20 * DT + 41.0)
    assert f.rank == 1
    assert f.message == ("rank 1 stuck 40 s in data/loader.py:next_batch at line 12; rank 0 "
                         "wait in torch/distributed/distributed_c10d.py:all_reduce at line "
                         "3252 (last completed step 20)")


def test_the_waiting_ranks_at_different_lines_are_named_without_a_line():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 20), _hang(0, 20), _hang(1, 20),
                 _hang(3, 20, (ALL_REDUCE[0], ALL_REDUCE[1], 3260)),
                 _hang(2, 20, ("data/loader.py", "next_batch", 12))])
    [f] = suite.tick(T0 + 20 * DT + 41.0)
    assert f.message.endswith("; ranks 0-1,3 wait in torch/distributed/distributed_c10d.py:"
                              "all_reduce (last completed step 20)"), f.message


def test_a_gone_rank_page_says_its_silence_the_waiting_ranks_and_both_steps():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 20), *_steps(range(3), 21)[60:]])
    feed(suite, [_hang(r, 21) for r in range(3)])
    silent_since = T0 + 20 * DT
    [f] = suite.tick(silent_since + 61.37)
    assert f.message == ("rank 3 sent nothing for 61 s and no hang report: its process is "
                         "gone (killed or crashed); ranks 0-2 wait 40 s in "
                         "torch/distributed/distributed_c10d.py:all_reduce at line 3252, "
                         "called from train.py:88 (last completed step 20-21)")
    assert f.evidence["ranks"]["3"] == {"state": "gone", "last_step": 20,
                                        "silent_seconds": 61.4}
    assert f.evidence["ranks"]["0"]["state"] == "hung"
    assert (f.value, f.suggestions) == (4.0, GONE + HUNG)
    assert (f.evidence["stuck_in"], f.evidence["called_from"]) == ("", "")  # rank 3's: none
    # its watchdog's report arrives after all (a stopped process continued): the picture
    # changed, so the page says so at once, not at the next repeat
    feed(suite, [_hang(3, 20, stuck=61.0)])
    [again] = suite.tick(silent_since + 62.0)
    assert (again.evidence["hung_ranks"], again.evidence["gone_ranks"]) == ([0, 1, 2, 3], [])


def test_ranks_whose_node_is_not_heard_are_said_and_do_not_hold_the_page():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(4), 20)])
    suite.ctx.unreachable = {1}
    feed(suite, [_hang(0, 20), _hang(2, 20), _hang(3, 20)])
    [f] = suite.tick(T0 + 20 * DT + 41.0)
    assert f.message == ("ranks 0,2-3 stuck 40 s in torch/distributed/distributed_c10d.py:"
                         "all_reduce at line 3252, called from train.py:88; rank 1 not heard "
                         "from: their node's sidecar is away, so whether they run is not known "
                         "(last completed step 20)")
    assert f.evidence["unreachable_ranks"] == [1] and f.evidence["gone_ranks"] == []
    assert f.evidence["ranks"]["1"] == {"state": "running", "last_step": 20}


def test_nothing_is_paged_after_the_run_ended():
    """Both ranks hung, then the run's end arrives before the clock judges them."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(2), 20), _hang(0, 20), _hang(1, 20)])
    suite.update(EndRecord(run_id="r", step=20, time=T0 + 20 * DT + 40.5, status="failed",
                           error="RuntimeError: timeout"))
    assert suite.tick(T0 + 20 * DT + 41.0) == []


def test_a_declared_floor_of_0_is_no_watchdog():
    """The client never declares a floor of 0 (it refuses one); a record that does is read
    as declaring none, so silence is left to ``stalled``."""
    suite = only("hang")
    feed(suite, [RunRecord(run_id="r", time=T0, watchdog=WatchdogDeclaration(
        floor_seconds=0.0, factor=5.0)), *_steps(range(1), 20)])
    assert suite.tick(T0 + 10**6) == []


def test_a_restored_detector_repeats_the_page_on_the_same_schedule():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(2), 20), _hang(0, 20), _hang(1, 20)])
    at = T0 + 20 * DT + 41.0
    [f] = suite.tick(at)
    assert f.message.startswith("ranks 0-1 stuck 40 s in ")
    back = _restored(suite)
    assert back.tick(at + 1.0) == []
    assert len(back.tick(at + 60.0)) == 1  # hang_repeat_seconds after, to the second


def test_a_restored_detector_settles_from_the_first_report_it_had():
    suite = only("hang", hang_settle_seconds=15.0)
    feed(suite, [_run(), *_steps(range(2), 20), _hang(0, 20)])
    report = T0 + 20 * DT + 40.0
    back = _restored(suite)
    feed(back, [dataclasses.replace(step(i, rank=1), time=report - 20.0 + i)
                for i in range(21, 35)])
    assert back.tick(report + 1.0) == []
    [f] = back.tick(report + 16.0)
    assert f.evidence["hung_ranks"] == [0]


def test_a_restored_detector_keeps_the_declared_watchdog():
    """One rank stepping every 10 s under a watchdog of max(30 s, 5 x its median): its limit
    is 50 s, so it is gone past 100 s of silence, not at 2 x the floor, and not at 100 s."""
    suite = only("hang")
    feed(suite, [_run(), *[dataclasses.replace(step(i), time=T0 + 10.0 * i)
                           for i in range(1, 12)]])
    last = T0 + 110.0
    back = _restored(suite)
    for s in (suite, back):
        assert s.tick(last + 61.0) == []
        assert s.tick(last + 100.0) == []
        assert [f.evidence["gone_ranks"] for f in s.tick(last + 100.5)] == [[0]]


def test_a_restored_run_without_a_watchdog_still_leaves_silence_to_stalled():
    suite = only("hang")
    feed(suite, [_run(watchdog=False), *_steps(range(2), 20)])
    assert _restored(suite).tick(T0 + 10**6) == []


def test_a_short_declared_floor_is_taken_as_declared():
    """A 0.5 s watchdog floor, one step seen (no median yet): gone past 1 s of silence."""
    suite = only("hang")
    feed(suite, [RunRecord(run_id="r", time=T0, watchdog=WatchdogDeclaration(
        floor_seconds=0.5, factor=5.0)), step(1)])
    assert suite.tick(T0 + DT + 1.0) == []
    assert [f.evidence["gone_ranks"] for f in suite.tick(T0 + DT + 3.0)] == [[0]]


def test_without_a_declared_watchdog_the_peers_limit_judges_a_silent_rank():
    """No watchdog declared: the peers' 30 s limit is rank 3's. The page waits for it (it
    has not stepped past where they are stuck), and it is gone past 2 x that limit."""
    suite = only("hang", hang_settle_seconds=15.0)
    feed(suite, [_run(watchdog=False), *_steps(range(4), 20), *_steps(range(3), 21)[60:]])
    feed(suite, [_hang(r, 21) for r in range(3)])
    report = T0 + 21 * DT + 40.0
    assert suite.tick(report + 16.0) == []
    [f] = suite.tick(T0 + 20 * DT + 61.0)
    assert f.evidence["gone_ranks"] == [3] and f.evidence["hung_ranks"] == [0, 1, 2]


def test_the_settle_time_and_a_rank_within_its_limit_are_inclusive():
    """Rank 1 stepped past where rank 0 is stuck and was heard exactly its 30 s limit ago,
    15 s to the second after rank 0's report: it is not waited for, and the page goes."""
    suite = only("hang", hang_settle_seconds=15.0)
    feed(suite, [_run(), *_steps(range(2), 20),
                 *[dataclasses.replace(step(i, rank=1), time=T0 + 10.0 + (i - 20) * DT)
                   for i in range(21, 71)],
                 _hang(0, 20)])  # sent at T0 + 50; rank 1 last heard at T0 + 35
    [f] = suite.tick(T0 + 65.0)
    assert f.evidence["hung_ranks"] == [0] and f.evidence["gone_ranks"] == []


def test_a_rank_silent_exactly_the_peers_margin_is_not_yet_gone():
    """The peers' reports seen the moment they were sent: 30 + 2 x 1 s = 32 s of silence is
    the margin; rank 3 is gone only past it."""
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(3), 21), *_steps(range(3, 4), 18)])
    feed(suite, [_hang(r, 21, stuck=30.5) for r in range(3)])  # sent at T0 + 41
    assert suite.tick(T0 + 41.0) == []
    assert [f.evidence["gone_ranks"] for f in suite.tick(T0 + 41.5)] == [[3]]


def test_reports_without_their_limit_judge_no_silent_rank_gone():
    """An older client's reports carry no limit and no watchdog is declared: nothing says
    when a live rank would have reported, so the silent rank is never called gone."""
    suite = only("hang", hang_settle_seconds=15.0)
    feed(suite, [_run(watchdog=False), *_steps(range(2), 20), _report(0, 20, (MAIN,),
                                                                       limit=None)])
    report = T0 + 20 * DT + 40.0
    [f] = suite.tick(report + 15.0)
    assert (f.evidence["hung_ranks"], f.evidence["gone_ranks"]) == ([0], [])
    [later] = suite.tick(report + 1000.0)
    assert later.evidence["gone_ranks"] == []


def test_a_rank_heard_only_through_evaluations_is_not_judged_gone():
    suite = only("hang")
    feed(suite, [_run(), *_steps(range(1), 20),
                 EvalRecord(run_id="r", step=20, time=T0 + 20 * DT, val_loss=1.0, rank=1)])
    [f] = suite.tick(T0 + 20 * DT + 61.0)
    assert f.evidence["gone_ranks"] == [0]
