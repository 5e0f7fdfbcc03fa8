"""hang: the client's hang reports gathered per rank, judged on an injected clock; a rank
silent with no report is a process that is gone."""

from __future__ import annotations

import dataclasses

from synth_records import DT, T0, assert_restore_equivalent, feed, only, step

from monitor_agent.records.types import HangRecord, RunRecord, WatchdogDeclaration

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
