"""stalled: silence far beyond the median step interval, judged by an injected clock."""

from __future__ import annotations

from synth_records import DT, assert_restore_equivalent, feed, only, run, step

from monitor_agent.records.types import EndRecord, HangRecord


def _steps(n: int) -> list:
    return [run()] + [step(i) for i in range(1, n)]


def test_silence_past_the_limit_fires_once_then_repeats():
    suite = only("stalled", stall_min_seconds=60.0, stall_repeat_seconds=600.0)
    recs = _steps(100)
    feed(suite, recs)
    last = recs[-1].time
    assert suite.tick(last + 59.0) == []
    found = suite.tick(last + 61.0)
    assert [(f.type, f.step, f.rank) for f in found] == [("stalled", 99, 0)]
    assert found[0].time == last + 61.0 and found[0].threshold == 60.0
    assert suite.tick(last + 300.0) == []
    assert len(suite.tick(last + 700.0)) == 1


def test_limit_scales_with_the_step_interval():
    suite = only("stalled", stall_min_seconds=0.0, stall_factor=20.0)
    feed(suite, _steps(50))
    last = 49 * DT + 1_700_000_000.0
    assert suite.tick(last + 20 * DT - 0.01) == []
    assert len(suite.tick(last + 20 * DT + 0.01)) == 1


def test_an_ended_run_never_stalls():
    suite = only("stalled")
    recs = _steps(50)
    recs.append(EndRecord(run_id="r", step=49, time=recs[-1].time + 0.1))
    feed(suite, recs)
    assert suite.tick(recs[-1].time + 10**6) == []


def test_a_silence_its_watchdog_reported_is_left_to_the_hang_page():
    """A rank that reported where it is stuck is the ``hang`` detector's page (every rank's
    frame, the processes that are gone): a second page for the same silence would repeat
    it with less. Its next step ends that, and a later silence is a stall again."""
    suite = only("stalled", stall_min_seconds=60.0)
    recs = _steps(50)
    feed(suite, recs)
    last = recs[-1].time
    feed(suite, [HangRecord(run_id="r", step=49, time=last + 30.0, stuck_seconds=30.0)])
    assert suite.tick(last + 100.0) == []
    feed(suite, [step(i) for i in range(50, 60)])
    last = 1_700_000_000.0 + 59 * DT
    assert [f.step for f in suite.tick(last + 100.0)] == [59]


def test_a_resumed_run_is_quiet_again():
    suite = only("stalled", stall_min_seconds=60.0)
    feed(suite, _steps(50))
    assert suite.tick(1_700_000_000.0 + 49 * DT + 100) != []
    feed(suite, [step(i) for i in range(300, 310)])
    assert suite.tick(1_700_000_000.0 + 309 * DT + 10) == []


def test_too_little_history_never_fires():
    suite = only("stalled")
    feed(suite, _steps(3))
    assert suite.tick(1e12) == []


def test_restore_mid_stream_changes_nothing():
    recs = _steps(200)
    assert_restore_equivalent(lambda: only("stalled", stall_min_seconds=1.0), recs, cut=100,
                              final_tick=recs[-1].time + 3600.0)
