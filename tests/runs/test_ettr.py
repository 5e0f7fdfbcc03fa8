"""Meta's effective-training-time figures from a goodput ledger (runs/ettr.py)."""

from __future__ import annotations

from monitor_agent.records.types import HangRecord, RunRecord, StepRecord
from monitor_agent.runs.ettr import ettr_of
from monitor_agent.runs.goodput import GoodputLedger


def _figures(book: GoodputLedger):
    report = book.report()
    return ettr_of(report.to_dict(), report.ratio)


def _feeder(book: GoodputLedger):
    """``feed(record, attempt)``: into ``book`` as the store hands records, each its row."""
    rows = iter(range(1, 10**6))

    def feed(record, attempt: int) -> None:
        book.feed(record, attempt, next(rows))
    return feed


def test_a_hang_ended_by_a_relaunch_is_one_failure_from_the_fault_to_the_next_step():
    book = GoodputLedger()
    feed = _feeder(book)

    feed(RunRecord("r", time=100.0), 1)
    for s in range(1, 21):  # 1 s steps, the first after 3 s of start-up
        feed(StepRecord("r", s, time=103.0 + s), 1)
    feed(HangRecord("r", 20, time=133.0, stuck_seconds=10.0), 1)  # stuck since 124
    feed(RunRecord("r", time=140.0), 2)  # relaunched at 140
    book.settled(2, 16, "restart")
    for s in range(16, 31):
        feed(StepRecord("r", s, time=145.0 + (s - 16)), 2)  # first step 5 s after
    figures = _figures(book)
    assert figures.failures == 1
    [rec] = figures.recoveries
    assert rec.kind == "hang" and rec.step == 20
    assert rec.start == 124.0 and rec.open is False
    # 16 s hung (124 -> 140), then the relaunch's start-up (5 s less one typical 1 s step)
    assert rec.seconds == 20.0
    assert rec.lost == 5.0  # steps 16-20 trained twice
    assert figures.time_to_start == 3.0
    assert figures.to_dict()["time_to_recover_p99_seconds"] == 20.0


def test_a_crash_relaunch_and_a_hang_that_recovered_in_place_are_two_failures():
    book = GoodputLedger()
    feed = _feeder(book)

    feed(RunRecord("r", time=0.0), 1)
    for s in range(1, 11):
        feed(StepRecord("r", s, time=float(s)), 1)
    feed(HangRecord("r", 10, time=20.0, stuck_seconds=9.0), 1)
    feed(StepRecord("r", 11, time=25.0), 1)  # recovered in place: 14 s lost
    feed(RunRecord("r", time=40.0), 2)  # killed after step 11, relaunched 15 s later
    book.settled(2, 11, "resume")
    for s in range(11, 20):
        feed(StepRecord("r", s, time=41.0 + (s - 11)), 2)
    kinds = [(r.kind, r.seconds) for r in _figures(book).recoveries]
    assert kinds == [("hang", 14.0), ("restart", 15.0)]


def test_an_open_hang_is_a_failure_not_yet_recovered():
    book = GoodputLedger()
    book.feed(RunRecord("r", time=0.0), 1, 1)
    for s in range(1, 11):
        book.feed(StepRecord("r", s, time=float(s)), 1, 1 + s)
    book.feed(HangRecord("r", 10, time=20.0, stuck_seconds=9.0), 1, 20)
    figures = _figures(book)
    assert [r.open for r in figures.recoveries] == [True]
    assert figures.to_dict()["time_to_recover_p50_seconds"] is None


def test_a_hang_whose_processes_ended_before_the_relaunch_is_one_failure():
    """The ranks of a hung job leave (exit 75 on a restart, or a crash at the collective
    timeout: an end record each), and the launcher runs the job again some seconds later
    (a frozen rank's SIGKILL, the relaunch's imports): one failure, from the fault to the
    next step, not a hang and then a relaunch."""
    from monitor_agent.records.types import EndRecord

    book = GoodputLedger()
    feed = _feeder(book)

    feed(RunRecord("r", time=100.0), 1)
    for s in range(1, 21):
        feed(StepRecord("r", s, time=103.0 + s), 1)
    feed(HangRecord("r", 20, time=133.0, stuck_seconds=10.0), 1)  # stuck since 124
    feed(EndRecord("r", 20, time=135.0, status="failed", error="restart"), 1)  # left at 135
    feed(RunRecord("r", time=165.0), 2)  # the launcher ran it again 30 s later
    book.settled(2, 16, "restart")
    for s in range(16, 31):
        feed(StepRecord("r", s, time=170.0 + (s - 16)), 2)
    figures = _figures(book)
    assert [(r.kind, r.step, r.start) for r in figures.recoveries] == [("hang", 20, 124.0)]
    # 11 s hung (124 -> 135), 30 s until the relaunch, its start-up (5 s less a 1 s step)
    assert figures.recoveries[0].seconds == 45.0
    assert figures.recoveries[0].lost == 5.0
