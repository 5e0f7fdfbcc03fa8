"""The goodput ledger (monitor_agent/runs/goodput.py) fed records of known timing: a rollback's
discarded work, skipped and loss-scale steps, the straggler tax of 4 ranks, a hang still open
read as of ``now``, and a ledger that goes through its stored state and on. Over real HTTP,
tests/api/test_goodput.py; with a real training job, tests/e2e/test_goodput_faults.py."""

from __future__ import annotations

import json
import math

import pytest

from monitor_agent.records.types import (
    CheckpointRecord,
    EndRecord,
    EvalRecord,
    HangRecord,
    RunRecord,
    StepRecord,
)
from monitor_agent.runs.goodput import (
    CAUSES,
    MARKS_KEPT,
    GoodputLedger,
    GoodputReport,
    cost_words,
)

T0 = 1_000.0


class Feed:
    """Feeds one ledger records in arrival order, numbering their rows."""

    def __init__(self, book: GoodputLedger | None = None) -> None:
        self.book = book or GoodputLedger()
        self.row = 0

    def __call__(self, record, attempt: int = 1) -> None:
        self.row += 1
        self.book.feed(record, attempt, self.row)


def _steps(feed: Feed, first: int, last: int, t: float, attempt: int = 1, every: float = 1.0,
           **fields) -> float:
    """Steps ``first..last`` of rank 0, one every ``every`` s after ``t``; returns the last
    one's time."""
    for step in range(first, last + 1):
        t += every
        feed(StepRecord("r", step, time=t, **fields), attempt)
    return t


def _adds_up(r: GoodputReport) -> None:
    assert r.productive + sum(r.badput.values()) == pytest.approx(r.wall)
    for a in r.attempts:
        assert a["productive_seconds"] + sum(a["badput_seconds"].values()) == pytest.approx(
            a["wall_seconds"])


def test_a_rollback_moves_the_steps_it_discarded_out_of_productive():
    """Steps take 1 s; checkpoint at 10; at step 20 the run rolls back to it (the reload
    takes 3 s) and does steps 11-25 again: the first 11-20 were work thrown away."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 10, T0)
    feed(CheckpointRecord("r", 10, time=t, path="/c/10.pt"))
    t = _steps(feed, 11, 20, t)
    # The engine's order: the new attempt's run record, its first step settles it (the
    # lifecycle's RolledBack: a plan was pending), then that step is fed.
    t += 3.0
    feed(RunRecord("r", time=t), attempt=2)
    feed.book.settled(2, 11, "rollback")
    t = _steps(feed, 11, 25, t, attempt=2)
    r = feed.book.report()
    assert r.badput["rollback"] == pytest.approx(10.0)
    assert r.badput["resume"] == 0.0
    assert r.badput["restart"] == pytest.approx(3.0)  # the reload, between the attempts
    assert r.productive == pytest.approx(25.0)  # steps 1-25 once each
    assert r.wall == pytest.approx(t - T0)
    _adds_up(r)
    [inc] = [i for i in r.incidents if i["kind"] == "rollback"]
    assert inc["step"] == 11 and inc["attempt"] == 2
    assert inc["detail"]["discarded"] == pytest.approx(10.0)
    assert inc["detail"]["gap"] == pytest.approx(3.0)
    assert inc["detail"].get("startup", 0.0) == pytest.approx(0.0)
    assert inc["seconds"] == pytest.approx(13.0)


def test_skipped_and_loss_scale_steps_are_their_own_badput():
    """The step guard skips steps 5 and 9 (their batches never reached the weights), the
    GradScaler overflows at 12-14: each such interval is badput, by reason."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = T0
    for step in range(1, 21):
        t += 1.0
        reason = ("grad_norm_outlier" if step in (5, 9) else
                  "loss_scale" if 12 <= step <= 14 else None)
        feed(StepRecord("r", step, time=t, skipped=reason is not None,
                        skip_reason=reason, loss_scale=1024.0))
    r = feed.book.report()
    assert r.badput["skipped"] == pytest.approx(2.0)
    assert r.badput["loss_scale"] == pytest.approx(3.0)
    assert r.productive == pytest.approx(15.0)
    _adds_up(r)
    assert r.summary() == "goodput 75.0%: 15.0% loss-scale skips, 10.0% skipped steps"


def test_the_straggler_tax_of_four_ranks_is_the_others_median_wait_less_the_slowest_ranks():
    """Rank 3 computes 0.2 s longer each step; ranks 0-2 wait for it at every all-reduce
    (and every rank pays the 10 ms collective): 20 steps cost 20 x 0.2 s, the straggler's
    own compute, named as the ``straggler`` finding names it."""
    feed = Feed()
    for rank in range(4):
        feed(RunRecord("r", time=T0, rank=rank, hardware={"world_size": 4, "device": "cuda"},
                       labels={"hostname": f"gpu-{rank // 2}"}))
    t = T0
    for step in range(1, 21):
        t += 1.0
        for rank in range(4):
            wait = 0.01 + (0.0 if rank == 3 else 0.2)
            feed(StepRecord("r", step, time=t, rank=rank, data_time=0.01, step_time=1.0,
                            sync_wait_time=wait, compute_time=1.0 - 0.01 - wait))
    r = feed.book.report()
    assert r.gpus == 4
    assert r.badput["straggler_compute"] == pytest.approx(19 * 0.2)  # the first is start-up
    assert r.badput["straggler_data"] == r.badput["straggler_collective"] == 0.0
    assert r.badput["input"] == pytest.approx(20 * 0.01)  # every rank's 10 ms, once
    assert r.productive == pytest.approx(20.0 - 3.8 - 20 * 0.01)
    assert (r.straggler.rank, r.straggler.who) == (3, "rank 3 on gpu-1")
    assert r.summary() == "goodput 80.0%: 19.0% straggler: compute (rank 3 on gpu-1), 1.0% input"
    _adds_up(r)
    # GPU-hours: the run's seconds times its 4 ranks.
    assert r.to_dict()["badput_gpu_hours"]["straggler_compute"] == pytest.approx(
        3.8 * 4 / 3600)


def test_an_open_hang_is_reported_as_of_now():
    """Steps take 1 s; after step 10 nothing for a while; the watchdog says so 5 s after the
    step (4 s after step 11 should have ended). Read 30 s after step 10, still hung."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 10, T0)
    feed(HangRecord("r", 10, time=t + 5.0, stuck_seconds=5.0, limit_seconds=4.0))
    assert feed.book.open_hang_cost(t + 30.0) == pytest.approx(29.0)
    r = feed.book.report(now=t + 30.0)
    assert r.badput["hang_undetected"] == pytest.approx(4.0)
    assert r.badput["hang_detected"] == pytest.approx(25.0)
    assert r.wall == pytest.approx(t + 30.0 - T0) and r.end == pytest.approx(t + 30.0)
    assert r.productive == pytest.approx(10.0)
    _adds_up(r)
    [hang] = r.incidents
    assert hang["kind"] == "hang" and hang["open"] and hang["step"] == 10
    # As of its latest record (no ``now``), the hang has cost nothing yet.
    assert feed.book.report().wall == pytest.approx(t + 5.0 - T0)
    # It recovers: step 11 comes 40 s after step 10, and closes it.
    feed(StepRecord("r", 11, time=t + 40.0, data_time=0.01))
    r = feed.book.report(now=t + 50.0)
    assert r.badput["hang_undetected"] + r.badput["hang_detected"] == pytest.approx(39.0)
    [hang] = r.incidents
    assert not hang["open"] and hang["seconds"] == pytest.approx(39.0)
    assert r.wall == pytest.approx(t + 40.0 - T0)  # closed: ``now`` no longer counts
    _adds_up(r)


def _story() -> list[tuple]:
    """A 2-rank run with every kind of event, as the engine hands them to the ledger:
    ("feed", record, attempt) or ("settle", attempt, start step, why). Steps take 1 s; a 2 s
    save after step 12; a hang after step 16 its watchdog reports; the process dies, and a
    relaunch 10 s later resumes from the checkpoint."""
    events: list[tuple] = [("feed", RunRecord("r", time=T0, rank=r, hardware={"world_size": 2},
                                              labels={"hostname": f"gpu-{r}"}), 1)
                           for r in (0, 1)]
    t = T0
    for step in range(1, 17):
        t += 1.0 + (2.0 if step == 13 else 0.0)
        events += [("feed", StepRecord("r", step, time=t, rank=r, data_time=0.01,
                                       sync_wait_time=0.01 + 0.1 * r), 1) for r in (0, 1)]
        if step == 12:
            events.append(("feed", CheckpointRecord("r", 12, time=t + 2.0, path="/c/12",
                                                    seconds=2.0), 1))
    events.append(("feed", HangRecord("r", 16, time=t + 7.0, stuck_seconds=7.0), 1))
    events.append(("feed", EndRecord("r", 16, time=t + 9.0, status="failed"), 1))
    t += 19.0
    events.append(("feed", RunRecord("r", time=t), 2))
    events.append(("settle", 2, 13, "resume"))
    for step in range(13, 31):
        t += 1.0 + (1.5 if step == 13 else 0.0)
        events.append(("feed", StepRecord("r", step, time=t, data_time=0.01), 2))
    return events


def _play(book: GoodputLedger, events: list[tuple], first_row: int = 1) -> None:
    for row, event in enumerate(events, first_row):
        if event[0] == "feed":
            book.feed(event[1], event[2], row)
        else:
            book.settled(*event[1:])


def test_the_stored_state_goes_on_as_the_ledger_would():
    """Kept (``to_state``, as JSON) and restored (``from_state``) at any point of a run (an
    open hang, a settle waiting for its attempt, ...), the ledger reads the same and goes on
    to the same report as one never interrupted."""
    events = _story()
    whole = GoodputLedger()
    _play(whole, events)
    final = whole.report()
    _adds_up(final)
    assert final.badput["checkpoint"] == pytest.approx(2.0)
    assert final.badput["resume"] > 0 and final.badput["hang_detected"] > 0
    assert final.badput["straggler_collective"] > 0 and final.straggler is not None
    for cut in range(len(events) + 1):
        kept = GoodputLedger()
        _play(kept, events[:cut])
        restored = GoodputLedger.from_state(json.loads(json.dumps(kept.to_state())))
        assert restored.to_state() == kept.to_state()
        assert restored.report(now=T0 + 200.0) == kept.report(now=T0 + 200.0), cut
        _play(restored, events[cut:], first_row=cut + 1)
        assert restored.report() == final, cut
    # The stored state says its format's version, for whoever reads it next.
    assert whole.to_state()["v"] == 2
    # A record it has seen (an older row id) changes nothing.
    before = whole.to_state()
    whole.feed(StepRecord("r", 31, time=T0 + 999.0), 2, 5)
    assert whole.to_state() == before


def test_a_hang_report_that_arrives_after_its_recovery_charges_no_later_step():
    """Another rank's (or node's) report of a hang at step 10 reaches the ledger only after
    the timeline's step 11, the recovery, did: step 12's second is a step, not a hang, and
    nothing is charged twice (no negative ``unaccounted``)."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t10 = _steps(feed, 1, 10, T0)
    feed(StepRecord("r", 11, time=t10 + 20.0))
    feed(HangRecord("r", 10, time=t10 + 5.0, stuck_seconds=5.0, rank=1))
    feed(StepRecord("r", 12, time=t10 + 21.0))
    r = feed.book.report()
    assert r.badput["hang_detected"] == r.badput["hang_undetected"] == 0.0
    assert r.badput["unaccounted"] >= 0.0 and r.productive == pytest.approx(r.wall)
    assert feed.book.hang is None and r.incidents == []
    _adds_up(r)


def test_the_timeline_is_the_lowest_rank_whichever_rank_s_step_arrives_first():
    """Two ranks; rank 1's records happen to arrive first; rank 0 alone evaluates (2 s after
    step 10): the evaluation is eval time, not a step's."""
    feed = Feed()
    for rank in (0, 1):
        feed(RunRecord("r", time=T0, rank=rank, hardware={"world_size": 2}))
    t = T0
    for step in range(1, 21):
        t += 1.0 + (2.0 if step == 11 else 0.0)
        for rank in (1, 0):
            feed(StepRecord("r", step, time=t, rank=rank))
        if step == 10:
            feed(EvalRecord("r", 10, time=t + 2.0, rank=0, val_loss=1.0, seconds=2.0))
    r = feed.book.report()
    assert feed.book.timeline_rank == 0
    assert r.badput["eval"] == pytest.approx(2.0) and r.productive == pytest.approx(20.0)
    _adds_up(r)


def test_a_resume_far_past_an_untimed_checkpoint_discards_only_the_steps_after_it():
    """An older client's checkpoint (no ``seconds``) at step 100; the process dies at step
    2600, more steps on than the ledger keeps marks for; the relaunch resumes at 101: steps
    101-2600 were done twice, steps 1-100 were not."""
    last = 2 * MARKS_KEPT + 552
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 100, T0)
    feed(CheckpointRecord("r", 100, time=t, path="/c/100"))
    t = _steps(feed, 101, last, t)
    feed(EndRecord("r", last, time=t, status="failed"))
    feed(RunRecord("r", time=t + 10.0), attempt=2)
    feed.book.settled(2, 101, "resume")
    _steps(feed, 101, 110, t + 10.0, attempt=2)
    r = feed.book.report()
    assert r.badput["resume"] == pytest.approx(last - 100)
    assert r.productive == pytest.approx(110.0)
    _adds_up(r)


def _resumed_run() -> tuple[list[tuple], int]:
    """tests/e2e/test_rollback_history.py's run, as the engine hands it to the ledger: an
    attempt that diverges (steps 1-330, each stamped 1000 + its step, in batches of 25) and
    a resume from the checkpoint of step 250 (steps 251-450, stamped the same way, so its
    clock overlaps the first attempt's), settled before its first record; and the index of
    that settle."""
    events: list[tuple] = [("feed", StepRecord("r", s, time=1000.0 + s), 1)
                           for s in range(1, 331)]
    settle = len(events)
    events.append(("settle", 2, 251, "resume"))
    events += [("feed", StepRecord("r", s, time=1000.0 + s), 2) for s in range(251, 451)]
    events.append(("feed", EndRecord("r", 450, time=1451.0, status="completed"), 2))
    return events, settle


def test_a_resume_settled_after_a_kill_9_and_the_re_feed_reads_as_one_settled_live():
    """A sidecar killed with SIGKILL after the resumed attempt's first batch (or anywhere
    before) restores its ledger as last kept, is fed again every record stored since (the
    abandoned branch's too) and only then settles the attempt (engine ``_reconcile``): the
    same report as the ledger that settled it live, before its first record. It was not:
    the restart's incident lost the attempt's start-up, its gap was whichever attempt's
    began last, and the e2e run's verdict said 16.7% resumed work on one sidecar, 17.8% on
    the other."""
    events, settle = _resumed_run()
    feeds = [e for e in events if e[0] == "feed"]
    rows = {id(e): row for row, e in enumerate(feeds, 1)}  # the store's row ids

    def play(book: GoodputLedger, part: list[tuple]) -> GoodputLedger:
        for event in part:
            if event[0] == "feed":
                book.feed(event[1], event[2], rows[id(event)])
            else:
                book.settled(*event[1:])
        return book

    final = play(GoodputLedger(), events).report()
    _adds_up(final)
    # The attempts overlap in time (a resume stamped by step): the run's wall is the two
    # attempts' (329 s + 200 s), not the 450 s span, so the 80 s done twice and the 448 s
    # kept add up to it without a negative ``unaccounted`` (was: "goodput 99.6%: 17.8%
    # resumed work", and -78 s unaccounted).
    assert final.wall == pytest.approx(529.0) and final.productive == pytest.approx(448.0)
    assert final.badput["resume"] == pytest.approx(80.0)
    assert all(v >= 0.0 for v in final.badput.values()), final.badput
    assert final.summary() == "goodput 84.7%: 15.1% resumed work, 0.2% unaccounted"
    [restart] = final.incidents
    assert restart["detail"] == {"discarded": 80.0, "gap": 0.0, "startup": 0.0}
    first_batch = settle + 1 + 25  # past the resumed attempt's first batch, stored
    for cut in range(first_batch + 1):  # where the ledger was last kept
        kept = play(GoodputLedger(), events[:cut])
        book = GoodputLedger.from_state(json.loads(json.dumps(kept.to_state())))
        # Killed once the first batch was stored: the restart feeds every stored record
        # after the ledger's position, then settles what it has not settled.
        play(book, [e for e in events[:first_batch] if e[0] == "feed"])
        book.settled(2, 251, "resume")
        play(book, events[first_batch:])
        assert book.report() == final, cut


def test_a_late_settle_takes_its_own_attempt_s_gap_and_start_up():
    """Two relaunches fed before either is settled (a restart after both were stored): each
    restart's incident has its own gap and start-up, as when settled live."""
    def run(late: bool) -> GoodputLedger:
        feed = Feed()
        feed(RunRecord("r", time=T0))
        t = _steps(feed, 1, 20, T0)
        feed(CheckpointRecord("r", 10, time=t, path="/c/10"))
        settles = [(2, 11, "resume"), (3, 21, "resume")]
        for (attempt, start, why), gap, startup in zip(settles, (5.0, 9.0), (3.0, 4.0),
                                                       strict=True):
            t += gap
            feed(RunRecord("r", time=t), attempt=attempt)
            if not late:
                feed.book.settled(attempt, start, why)
            t = _steps(feed, start, start + 9, t + startup, attempt=attempt)
        if late:
            for settle in settles:
                feed.book.settled(*settle)
        return feed.book

    live, late = run(False).report(), run(True).report()
    assert late == live
    gaps = [(i["attempt"], i["detail"]["gap"]) for i in live.incidents]
    assert gaps == [(2, 5.0), (3, 9.0)]
    assert all(i["detail"]["startup"] > 0 for i in live.incidents)
    _adds_up(live)


def test_an_eval_or_save_costs_what_it_says_within_the_time_it_had_and_nothing_unmeasured():
    """Steps take 1 s (one takes 2). What an eval or a save costs is what its record says,
    capped by the time it had: since the timeline's latest step (or the run's start), less
    what the others of that interval took; a record stamped before the latest step (another
    rank's) had that step's interval. A duration that is missing or not finite is not
    measured: it costs nothing. An eval before the first step is start-up, as all that
    time is."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    feed(EvalRecord("r", 0, time=T0 + 0.5, seconds=0.3))  # before step 1: start-up
    _steps(feed, 1, 10, T0)
    feed(EvalRecord("r", 10, time=T0 + 10.5, seconds=0.9))  # had 0.5 s: 0.5
    feed(EvalRecord("r", 10, time=T0 + 10.6, seconds=float("inf")))  # not measured
    feed(StepRecord("r", 11, time=T0 + 11))
    feed(CheckpointRecord("r", 11, time=T0 + 11.5, path="/c/11.pt"))  # not measured
    feed(EvalRecord("r", 11, time=T0 + 12.0, seconds=0.8))  # 0.8
    feed(EvalRecord("r", 11, time=T0 + 12.2, seconds=0.8))  # 1.2 s less 0.8 taken: 0.4
    feed(StepRecord("r", 12, time=T0 + 13))
    feed(CheckpointRecord("r", 12, time=T0 + 13, path="/c/12.pt", seconds=1.0))  # no time: 0
    feed(StepRecord("r", 13, time=T0 + 14))
    feed(CheckpointRecord("r", 13, time=T0 + 13.5, path="/c/13.pt", rank=1, seconds=5.0))
    feed(StepRecord("r", 14, time=T0 + 15))  # rank 1's save held step 14's interval: 1.0
    r = feed.book.report()
    assert r.badput["eval"] == pytest.approx(0.5 + 0.8 + 0.4)
    assert r.badput["checkpoint"] == pytest.approx(1.0)
    _adds_up(r)
    # The timeline's clock goes back: what evals claimed in the interval it ended is given
    # back, all of it, to the cause that claimed it.
    feed(EvalRecord("r", 14, time=T0 + 15.2, seconds=0.2))
    feed(EvalRecord("r", 14, time=T0 + 15.5, seconds=0.3))
    feed(StepRecord("r", 15, time=T0 + 14.5))
    r = feed.book.report()
    assert r.badput["eval"] == pytest.approx(0.5 + 0.8 + 0.4)
    _adds_up(r)


def test_the_typical_step_is_the_median_of_the_first_steps_not_the_first_one():
    """Up at T0, step 1 at T0 + 10; step 2 takes 5 s (a recompile), the next ones 1 s: a
    typical step is 1 s, so start-up is 9 s and step 2's extra time is productive."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    feed(StepRecord("r", 1, time=T0 + 10))
    feed(StepRecord("r", 2, time=T0 + 15))
    _steps(feed, 3, 12, T0 + 15)
    r = feed.book.report()
    assert r.badput["startup"] == pytest.approx(9.0)
    assert r.productive == pytest.approx(1.0 + 5.0 + 10.0)
    _adds_up(r)


def test_the_step_that_ends_a_hang_keeps_only_its_own_typical_time():
    """Steps take 0.5 s; after step 10 the run hangs until step 11 comes 20 s later: the
    hang is 19.5 s (from where step 11 should have ended), step 11 is 0.5 s productive."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 10, T0, every=0.5)
    feed(HangRecord("r", 10, time=t + 3.0, stuck_seconds=3.0))
    feed(StepRecord("r", 11, time=t + 20.0))
    r = feed.book.report()
    assert r.badput["hang_undetected"] + r.badput["hang_detected"] == pytest.approx(19.5)
    assert r.productive == pytest.approx(11 * 0.5)
    _adds_up(r)


def test_a_first_step_without_a_data_wait_is_charged_none_and_one_with_a_wait_alone_its_typical():
    """Steps take 1 s. The first step reports no data wait, the next ones 0.2 s: the first
    step's typical wait is not measured, and only the others' waits are input. The other
    way round (the first step waited 0.2 s, the others report none): a typical step waits
    nothing, so the first step's wait is start-up, not input."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    feed(StepRecord("r", 1, time=T0 + 1))
    _steps(feed, 2, 12, T0 + 1, data_time=0.2)
    assert feed.book.report().badput["input"] == pytest.approx(11 * 0.2)
    feed = Feed()
    feed(RunRecord("r", time=T0))
    feed(StepRecord("r", 1, time=T0 + 1, data_time=0.2))
    _steps(feed, 2, 12, T0 + 1)
    r = feed.book.report()
    assert r.badput["input"] == 0.0
    _adds_up(r)


def test_a_hang_s_cost_is_split_at_its_report_and_ends_where_its_processes_left():
    """Steps take 1 s. A hang after step 3, before a typical step is known: from step 3
    (no typical step to wait for) to the report is undetected, from the report to the
    recovery detected. A hang after step 10 whose processes then exit: it ends at their
    end, and the incident says when they left (runs/ettr.py pairs it with the relaunch)."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t3 = _steps(feed, 1, 3, T0)
    feed(HangRecord("r", 3, time=t3 + 5.0, stuck_seconds=5.0))
    feed(StepRecord("r", 4, time=t3 + 12.0))
    [hang] = feed.book.report().incidents
    assert (hang["open"], hang["seconds"], hang["detail"]) == (
        False, 12.0, {"undetected": 5.0, "detected": 7.0})
    t10 = _steps(feed, 5, 10, t3 + 12.0)
    feed(HangRecord("r", 10, time=t10 + 5.0, stuck_seconds=5.0))
    feed(EndRecord("r", 10, time=t10 + 20.0, status="failed"))
    hang = feed.book.report().incidents[-1]
    assert hang["detail"] == {"undetected": 4.0, "detected": 15.0, "left": t10 + 20.0}
    assert feed.book.last_incident("hang").seconds == 19.0


def test_a_hang_reported_at_once_or_ended_at_its_report_costs_no_second_more():
    """A rank's report stamped at the timeline's latest step's very time opens the hang,
    and none of it went undetected; a watchdog that ends its process as it reports leaves
    no detected time."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t10 = _steps(feed, 1, 10, T0)
    feed(HangRecord("r", 10, time=t10, stuck_seconds=5.0, rank=1))
    feed(StepRecord("r", 11, time=t10 + 10.0))
    [hang] = feed.book.report().incidents
    assert hang["detail"] == {"undetected": 0.0, "detected": 10.0}
    t20 = _steps(feed, 12, 20, t10 + 10.0)
    feed(HangRecord("r", 20, time=t20 + 5.0, stuck_seconds=5.0))
    feed(EndRecord("r", 20, time=t20 + 5.0, status="failed"))
    hang = feed.book.report().incidents[-1]
    assert hang["detail"] == {"undetected": 4.0, "detected": 0.0, "left": t20 + 5.0}


def test_one_hang_is_open_at_a_time_and_a_step_hangs_once():
    """Rank 0 reports a hang after step 10; rank 1's report of step 9 while it is open is
    the same hang; after the recovery, a late report of step 10 again is not a new one."""
    feed = Feed()
    for rank in (0, 1):
        feed(RunRecord("r", time=T0, rank=rank))
    t10 = _steps(feed, 1, 10, T0)
    feed(HangRecord("r", 10, time=t10 + 5.0, stuck_seconds=5.0))
    feed(HangRecord("r", 9, time=t10 + 6.0, stuck_seconds=7.0, rank=1))
    feed(StepRecord("r", 11, time=t10 + 20.0))
    feed(HangRecord("r", 10, time=t10 + 21.0, stuck_seconds=21.0, rank=1))
    feed(StepRecord("r", 12, time=t10 + 22.0))
    r = feed.book.report()
    [hang] = r.incidents
    assert (hang["step"], hang["seconds"], hang["open"]) == (10, 19.0, False)
    assert r.badput["hang_undetected"] + r.badput["hang_detected"] == 19.0


def test_a_hang_in_a_relaunched_attempt_is_that_attempt_s_and_costs_nothing_until_read_as_of_now():
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 5, T0)
    feed(RunRecord("r", time=t + 10.0), attempt=2)
    t = _steps(feed, 6, 15, t + 10.0, attempt=2)
    feed(HangRecord("r", 15, time=t + 5.0, stuck_seconds=5.0), attempt=2)
    [hang] = feed.book.report().incidents
    assert (hang["attempt"], hang["open"], hang["seconds"]) == (2, True, 0.0)
    [hang] = feed.book.report(now=t + 9.0).incidents
    assert hang["seconds"] == 8.0  # one typical step after step 15, until now
    assert feed.book.open_hang_cost(t + 9.0) == 8.0
    assert feed.book.open_hang_cost(t) == 0.0  # read before the hang began


def test_no_hang_open_costs_nothing():
    feed = Feed()
    feed(RunRecord("r", time=T0))
    _steps(feed, 1, 5, T0)
    assert feed.book.open_hang_cost(T0 + 100.0) == 0.0


def test_an_attempt_begins_when_the_record_that_settled_it_says_ahead_of_its_own_records():
    """Attempt 1 stops after step 10; the launcher's record of attempt 2 (``begin``) says it
    began 30 s later; its own first record comes 10 s after that, its first step 2 s after:
    the gap is the restart, the 12 s from its beginning to its first step start-up. A
    begin for an attempt heard already, or at no finite time, changes nothing."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t10 = _steps(feed, 1, 10, T0)
    feed.book.begin(1, t10 + 5.0)
    feed.book.begin(2, math.nan)
    assert feed.book.current == 1
    feed.book.begin(2, t10 + 30.0)
    feed.book.begin(2, t10 + 35.0)
    feed(RunRecord("r", time=t10 + 40.0), attempt=2)
    _steps(feed, 11, 12, t10 + 40.0, attempt=2, every=2.0)
    r = feed.book.report()
    assert [a["start"] for a in r.attempts] == [T0, t10 + 30.0]
    assert r.badput["restart"] == 30.0
    assert r.attempts[1]["badput_seconds"]["startup"] == 12.0
    _adds_up(r)


def test_cost_words_round_to_what_a_reader_needs():
    assert cost_words(36_000, 64) == "10.0 h x 64 GPUs = 640 GPU-hours"
    assert cost_words(840, 64) == "14 min x 64 GPUs = 15 GPU-hours"
    assert cost_words(20, 2, "cpu") == "20 s x 2 CPU processes = 0.011 process-hours"
    assert cost_words(60, 4, None) == "60 s x 4 ranks = 0.067 rank-hours"
    assert cost_words(5.25, 1) == "5.2 s"


def test_the_report_s_device_hours_are_its_seconds_times_the_ranks_stepping():
    feed = Feed()
    for rank in (0, 1):
        feed(RunRecord("r", time=T0, rank=rank, hardware={"device": "cuda"}))
    t = T0
    for step in range(1, 13):
        t += 1.0
        for rank in (0, 1):
            feed(StepRecord("r", step, time=t, rank=rank))
    d = feed.book.report().to_dict()
    assert (d["gpus"], d["device"], d["productive_seconds"]) == (2, "cuda", 12.0)
    assert d["gpu_hours"] == pytest.approx(12.0 * 2 / 3600)
    assert d["productive_gpu_hours"] == pytest.approx(12.0 * 2 / 3600)
    assert d["device_words"] == {"one": "GPU", "many": "GPUs", "hours": "GPU-hours"}


def test_the_summary_names_the_three_worst_causes_of_at_least_a_twentieth_of_a_percent():
    badput = dict.fromkeys(CAUSES, 0.0)
    badput.update(startup=100.0, input=150.0, checkpoint=50.0, eval=80.0, restart=0.6,
                  skipped=0.4)
    r = GoodputReport(T0, T0 + 1000.0, 1000.0, 619.0, badput, 1, [], [])
    assert r.summary() == "goodput 61.9%: 15.0% input, 10.0% start-up, 8.0% eval"
    assert r.summary(top=10) == ("goodput 61.9%: 15.0% input, 10.0% start-up, 8.0% eval, "
                                 "5.0% checkpoints, 0.1% restarts")
    assert GoodputLedger().report().summary() == "goodput not measured yet"


def test_a_version_1_stored_ledger_is_read_as_it_was_kept():
    """A ledger stored by version 1 (no ranks seen stepping, device, hosts or settles; a
    rank's summed wait a bare number; an attempt without its eval/save and wait fields)
    reads as one weighed by every rank heard, with its buckets and summed waits."""
    events = _story()[:30]  # attempt 1, step 14
    book = GoodputLedger()
    _play(book, events)
    v2 = json.loads(json.dumps(book.to_state()))
    v1 = {k: v for k, v in v2.items()
          if k not in ("v", "stepped", "device", "hosts", "settles", "settled_attempts")}
    v1["attempts"] = [[*a[:11], {r: w[0] for r, w in a[11].items()}, a[12]]
                      for a in v2["attempts"]]
    old = GoodputLedger.from_state(v1)
    assert old.gpus == len(v2["ranks"]) == 2 and old.device is None and old.hosts == {}
    [att] = old.attempts.values()
    assert att.buckets.badput == book.attempts[1].buckets.badput
    assert {r: (s.wait, s.steps) for r, s in att.sums.items()} == {
        r: (s.wait, 1) for r, s in book.attempts[1].sums.items()}
    assert (att.aside, att.last_interval, att.first_wait, att.waits) == ({}, 0.0, 0.0, [])
    assert old.report().wall == book.report().wall == 16.0


def test_a_resume_at_the_last_step_kept_discards_that_step():
    """The process saved at step 9 and died after step 10: the relaunch resumes at 10, so
    step 10 was done twice (its second of work is ``resume``)."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 10, T0)
    feed(CheckpointRecord("r", 9, time=t - 1.0, path="/c/9"))
    feed(RunRecord("r", time=t + 5.0), attempt=2)
    feed.book.settled(2, 10, "resume")
    _steps(feed, 10, 15, t + 6.0, attempt=2)
    r = feed.book.report()
    assert r.badput["resume"] == 1.0 and r.incidents[0]["detail"]["discarded"] == 1.0
    _adds_up(r)


def test_a_rollback_past_an_earlier_resume_discards_all_of_the_attempt_that_redid_the_work():
    """Attempt 2 resumed at step 11 (nothing lost: attempt 1 ended at 10) and did 11-20;
    attempt 3 rolls back to step 11 again: all of attempt 2's work is thrown away, none of
    attempt 1's."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 10, T0)
    feed(RunRecord("r", time=t + 5.0), attempt=2)
    feed.book.settled(2, 11, "resume")
    t = _steps(feed, 11, 20, t + 6.0, attempt=2)
    before = feed.book.report()
    redone = before.attempts[1]["productive_seconds"]
    assert before.badput["resume"] == 0.0 and redone > 0
    feed(RunRecord("r", time=t + 5.0), attempt=3)
    feed.book.settled(3, 11, "rollback")
    _steps(feed, 11, 13, t + 6.0, attempt=3)
    r = feed.book.report()
    assert r.badput["rollback"] == pytest.approx(redone)
    assert r.attempts[0]["productive_seconds"] == before.attempts[0]["productive_seconds"]
    assert r.attempts[1]["productive_seconds"] == pytest.approx(0.0, abs=1e-9)
    _adds_up(r)


def test_a_resume_over_steps_that_were_all_skipped_discards_nothing():
    """Steps 13 and 14 were skipped by the step guard (their batches never reached the
    weights, no productive time); a resume at 13 throws no work away."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 12, T0)
    t = _steps(feed, 13, 14, t, skipped=True)
    feed(RunRecord("r", time=t + 5.0), attempt=2)
    feed.book.settled(2, 13, "resume")
    _steps(feed, 13, 16, t + 6.0, attempt=2)
    r = feed.book.report()
    assert r.badput["resume"] == 0.0 and r.incidents[0]["detail"]["discarded"] == 0.0
    _adds_up(r)


def test_a_rollback_past_two_attempts_work_counts_both_in_its_incident():
    """Attempt 2 resumed attempt 1's run at step 16; attempt 3 rolls back to step 13: steps
    13-15 of attempt 1 and all of attempt 2's are thrown away, one incident's worth."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 20, T0)
    feed(RunRecord("r", time=t + 5.0), attempt=2)
    feed.book.settled(2, 16, "resume")
    t = _steps(feed, 16, 25, t + 6.0, attempt=2)
    before = feed.book.report()
    redone = before.attempts[1]["productive_seconds"]
    feed(RunRecord("r", time=t + 5.0), attempt=3)
    feed.book.settled(3, 13, "rollback")
    r = feed.book.report()
    rollback = r.incidents[-1]
    assert rollback["kind"] == "rollback" and rollback["attempt"] == 3
    assert rollback["detail"]["discarded"] == pytest.approx(3.0 + redone)
    assert r.badput["rollback"] == pytest.approx(3.0 + redone)
    _adds_up(r)


def test_a_cause_of_exactly_a_twentieth_of_a_percent_is_named_and_no_badput_names_none():
    badput = dict.fromkeys(CAUSES, 0.0)
    assert GoodputReport(T0, T0 + 10.0, 10.0, 10.0, dict(badput), 1, [], []).summary() == \
        "goodput 100.0%"
    badput["restart"] = 0.5
    r = GoodputReport(T0, T0 + 1000.0, 1000.0, 999.5, badput, 1, [], [])
    assert r.summary() == f"goodput {0.9995:.1%}: 0.1% restarts"


def test_a_settle_waiting_for_its_attempt_is_kept_with_the_ledger():
    """Settled before its first record was fed, stored and restored in between: the
    resume is accounted as if the ledger had never been stored."""
    def run(store: bool) -> GoodputLedger:
        feed = Feed()
        feed(RunRecord("r", time=T0))
        t = _steps(feed, 1, 20, T0)
        feed.book.settled(2, 15, "resume")
        if store:
            feed.book = GoodputLedger.from_state(json.loads(json.dumps(feed.book.to_state())))
        feed(RunRecord("r", time=t + 5.0), attempt=2)
        _steps(feed, 15, 20, t + 6.0, attempt=2)
        return feed.book

    live, stored = run(False).report(), run(True).report()
    assert stored == live and live.badput["resume"] > 0


def test_a_resume_within_the_first_steps_keeps_the_first_step_s_time():
    """Steps take 1 s; saved at step 4, the process dies after step 10, the relaunch
    resumes at 5: steps 5-10 (6 s) were done twice, not the first step too (its time is
    known only once a typical step is, at step 9, after the marks of steps 1-8)."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = _steps(feed, 1, 10, T0)
    feed(CheckpointRecord("r", 4, time=T0 + 4.0, path="/c/4"))
    feed(RunRecord("r", time=t + 5.0), attempt=2)
    feed.book.settled(2, 5, "resume")
    _steps(feed, 5, 8, t + 6.0, attempt=2)
    r = feed.book.report()
    assert r.badput["resume"] == pytest.approx(6.0)
    assert r.incidents[0]["detail"]["discarded"] == pytest.approx(6.0)
    assert r.attempts[0]["productive_seconds"] == pytest.approx(4.0)
    _adds_up(r)
