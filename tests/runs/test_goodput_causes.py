"""The goodput ledger's causes read the way the findings do (issue 50), and its figures stay
within the time that passed (issue 48, item 5): a loader slow on every step is input badput,
all of it; on a GPU the device's idle part of the wait; a straggler's tax names what it
spends its time on and who it is, once, whichever rank the timeline is; an eval or a save
claiming 1e308 seconds costs at most the interval it sits in; a run is weighed by the ranks
seen stepping, and a CPU-only run's are not GPUs."""

from __future__ import annotations

import math

import pytest

from monitor_agent.records.types import CheckpointRecord, EvalRecord, RunRecord, StepRecord
from monitor_agent.runs.goodput import GoodputLedger, GoodputReport

T0 = 1_000.0


class Feed:
    def __init__(self) -> None:
        self.book = GoodputLedger()
        self.row = 0

    def __call__(self, record, attempt: int = 1) -> None:
        self.row += 1
        self.book.feed(record, attempt, self.row)


def _adds_up(r: GoodputReport) -> None:
    assert all(math.isfinite(v) and v >= -1e-9 for v in r.badput.values()), r.badput
    assert r.productive + sum(r.badput.values()) == pytest.approx(r.wall)


def _waits(n: int) -> list[float]:
    """A loader's wait per step: 200 ms of a 250 ms step, each step its own few ms more or
    less (a real loader is never constant), one in 7 a slow read of 100 ms more."""
    return [0.2 + 0.003 * (s % 5) - 0.006 + 0.1 * (s % 7 == 0) for s in range(1, n + 1)]


def test_a_loader_slow_on_every_step_is_input_badput_all_of_it():
    """The issue's run: no prefetch, the loader 200 ms of every ~250 ms step. Every step
    waited its whole data time (the first too, once it is known to be a step): that is the
    input bucket, to the microsecond; no floor of the loader's own waits hides it (a
    floor at any percentile of these waits would take 0.19 s or more off each step)."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t, waits = T0, _waits(60)
    for step, wait in enumerate(waits, 1):
        t += 0.05 + wait
        feed(StepRecord("r", step, time=t, data_time=wait, step_time=0.05 + wait))
    r = feed.book.report()
    assert r.badput["input"] == pytest.approx(sum(waits), abs=1e-9)
    assert r.productive == pytest.approx(60 * 0.05, abs=1e-9)
    assert r.summary() == "goodput 19.0%: 81.0% input"
    _adds_up(r)


def test_the_device_s_idle_part_of_the_wait_is_the_input_on_a_gpu():
    """On a GPU the host may wait on the loader while the device still runs work queued
    before (``data_idle_time``, the client's CUDA events, is what the device idled): only
    that part is input. A step that did not measure it (no events) falls back to the
    thread's whole wait."""
    feed = Feed()
    feed(RunRecord("r", time=T0, hardware={"device": "cuda"}))
    t = T0
    for step in range(1, 21):
        t += 0.3
        idle = None if step > 15 else 0.05
        feed(StepRecord("r", step, time=t, data_time=0.2, data_idle_time=idle, step_time=0.3))
    r = feed.book.report()
    assert r.badput["input"] == pytest.approx(15 * 0.05 + 5 * 0.2)
    _adds_up(r)


def _ddp(feed: Feed, ranks: int, steps: int, data: dict[int, float], hosts: int = 2,
         compute: float = 0.05, device: str = "cuda") -> float:
    """``ranks`` ranks on ``hosts`` nodes, each step waiting ``data[rank]`` (else 1 ms) for
    its batch; every rank waits in the all-reduce for the slowest. Returns the last time."""
    for r in range(ranks):
        feed(RunRecord("r", time=T0, rank=r, hardware={"world_size": ranks, "device": device},
                       labels={"hostname": f"gpu-{r * hosts // ranks}"}))
    own = {r: data.get(r, 0.001) + compute for r in range(ranks)}
    slowest = max(own.values())
    t = T0
    for step in range(1, steps + 1):
        t += slowest + 0.01
        for r in range(ranks):
            wait = slowest - own[r] + 0.01
            feed(StepRecord("r", step, time=t, rank=r, step_time=slowest + 0.01,
                            data_time=data.get(r, 0.001), compute_time=compute,
                            sync_wait_time=wait))
    return t


def test_a_slow_loader_on_one_rank_is_the_straggler_s_data_loading_named():
    """The issue's 2-node job: rank 2's loader takes 300 ms a step, the others' 1 ms. The
    others wait for it in every all-reduce: "straggler: data loading (rank 2 on gpu-1)",
    not input and not an unnamed straggler."""
    feed = Feed()
    _ddp(feed, 4, 50, {2: 0.3})
    r = feed.book.report()
    assert r.badput["straggler_data"] == pytest.approx(49 * 0.299, rel=1e-6)
    assert r.badput["straggler_compute"] == r.badput["straggler_collective"] == 0.0
    assert r.badput["input"] == pytest.approx(50 * 0.001)
    assert r.straggler.who == "rank 2 on gpu-1"
    assert "straggler: data loading (rank 2 on gpu-1)" in r.summary()
    _adds_up(r)


def test_a_timeline_rank_that_is_the_straggler_charges_its_slow_loading_once():
    """Rank 0 (the timeline) is the slow loader: its own steps hold the 300 ms as data
    wait, which the ledger's ``input`` took; the straggler tax moves it to
    ``straggler_data`` rather than charging it twice (productive stays the steps' compute)."""
    feed = Feed()
    _ddp(feed, 2, 50, {0: 0.3})
    r = feed.book.report()
    assert r.badput["straggler_data"] == pytest.approx(49 * 0.299, rel=1e-6)
    # Its first step's wait is a typical step's input (the tax sums from the second step).
    assert r.badput["input"] == pytest.approx(0.3 + 49 * 0.001, rel=1e-6)
    assert r.productive == pytest.approx(50 * (0.05 + 0.01), rel=1e-6)
    assert r.straggler.rank == 0
    _adds_up(r)


def test_two_ranks_cost_the_whole_extra_time_of_the_slow_one():
    """With two ranks the other rank's wait is the pace the job would keep: the tax is the
    whole 200 ms a step, not half of it (the median of both ranks would say 100 ms)."""
    feed = Feed()
    _ddp(feed, 2, 30, {1: 0.2})
    assert feed.book.report().badput["straggler_data"] == pytest.approx(29 * 0.199, rel=1e-6)


def test_a_whole_slow_node_is_named_as_the_node():
    feed = Feed()
    _ddp(feed, 4, 30, {2: 0.2, 3: 0.2})
    r = feed.book.report()
    assert r.straggler.who == "node gpu-1 (ranks 2-3)"
    assert r.badput["straggler_data"] == pytest.approx(29 * 0.199, rel=1e-6)


def test_a_rank_late_for_no_reason_of_its_own_is_the_collective():
    """Rank 1's data and compute are the others', yet they wait 150 ms for it each step
    (its link): the tax is ``straggler_collective``."""
    feed = Feed()
    for r in range(3):
        feed(RunRecord("r", time=T0, rank=r, hardware={"device": "cuda"}))
    t = T0
    for step in range(1, 31):
        t += 0.25
        for r in range(3):
            feed(StepRecord("r", step, time=t, rank=r, step_time=0.25, data_time=0.001,
                            compute_time=0.05, sync_wait_time=0.01 if r == 1 else 0.16))
    r = feed.book.report()
    assert r.badput["straggler_collective"] == pytest.approx(29 * 0.15)
    assert r.straggler.rank == 1 and r.straggler.who == "rank 1"


@pytest.mark.parametrize("kind", [EvalRecord, CheckpointRecord])
def test_a_duration_of_1e308_costs_at_most_the_interval_it_sits_in(kind):
    """An eval or a save after step 10 claiming 1e308 s, 2 s after that step (the next
    step comes 2 s after it): it cost those 2 s, every figure stays finite, the buckets
    add up, and the summary reads as percentages of the run."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = T0
    for step in range(1, 21):
        t += 1.0 + (2.0 if step == 11 else 0.0)
        feed(StepRecord("r", step, time=t))
        if step == 10:
            extra = {"val_loss": 1.0} if kind is EvalRecord else {"path": "/c/10"}
            feed(kind("r", 10, time=t + 2.0, seconds=1e308, **extra))
    r = feed.book.report()
    cause = "eval" if kind is EvalRecord else "checkpoint"
    assert r.badput[cause] == pytest.approx(2.0)
    assert r.productive == pytest.approx(20.0)
    _adds_up(r)
    assert r.summary() == f"goodput 90.9%: 9.1% {'eval' if cause == 'eval' else 'checkpoints'}"


def test_saves_claiming_more_than_their_interval_give_the_excess_back():
    """A save reported 3 s long 3 s after step 10 (its clock a little ahead), then the
    timeline's next step 2 s after step 10: the interval held 2 s, the save is 2 s."""
    feed = Feed()
    feed(RunRecord("r", time=T0))
    t = T0
    for step in range(1, 11):
        t += 1.0
        feed(StepRecord("r", step, time=t))
    feed(CheckpointRecord("r", 10, time=t + 3.0, path="/c/10", seconds=3.0, rank=1))
    feed(StepRecord("r", 11, time=t + 2.0))
    r = feed.book.report()
    assert r.badput["checkpoint"] == pytest.approx(2.0)
    _adds_up(r)


def test_a_run_is_weighed_by_the_ranks_seen_stepping_not_the_size_it_claims():
    """One rank stepping whose run record claims a million ranks is one device's time in
    the fleet's GPU-weighted figures; its CPU ranks are CPU processes, not GPUs."""
    feed = Feed()
    feed(RunRecord("r", time=T0, hardware={"world_size": 1_000_000, "device": "cpu"}))
    for step in range(1, 11):
        feed(StepRecord("r", step, time=T0 + step))
    r = feed.book.report()
    out = r.to_dict()
    assert r.gpus == 1 and out["gpu_hours"] == pytest.approx(10.0 / 3600)
    assert out["device_words"] == {"one": "CPU process", "many": "CPU processes",
                                   "hours": "process-hours"}
    # The size it claims is kept with the ledger (the largest any run record declared).
    feed(RunRecord("r", time=T0 + 11, rank=1, hardware={"world_size": 8}))
    assert feed.book.to_state()["world_size"] == 1_000_000


def test_one_gpu_rank_makes_it_a_gpu_run_whichever_rank_said_so_first():
    for devices in (("cpu", "cuda"), ("cuda", "cpu")):
        feed = Feed()
        for rank, device in enumerate(devices):
            feed(RunRecord("r", time=T0, rank=rank, hardware={"device": device}))
        feed(RunRecord("r", time=T0, rank=2, hardware={"device": "tpu"}))  # not one we know
        assert feed.book.report().device == "cuda", devices


def test_a_cpu_run_s_incident_costs_cpu_processes():
    feed = Feed()
    _ddp(feed, 2, 5, {}, device="cpu")
    feed(RunRecord("r", time=T0 + 100.0), attempt=2)
    feed.book.settled(2, 3, "resume")
    words = feed.book.report().incidents[-1]["words"]
    assert "x 2 CPU processes =" in words and "process-hours" in words and "GPU" not in words


@pytest.mark.parametrize("wait", [math.inf, -math.inf, math.nan])
def test_a_rank_s_step_with_no_finite_all_reduce_wait_is_left_out_of_the_straggler_sums(wait):
    """One rank's step says its all-reduce wait was not a number: the ledger sums that step
    as it would a step that said nothing of its wait (not at all)."""
    books = []
    for said in (wait, None):
        feed = Feed()
        for r in range(3):
            feed(RunRecord("r", time=T0, rank=r))
        t = T0
        for step in range(1, 11):
            t += 0.25
            for r in range(3):
                sync = said if (r, step) == (1, 5) else (0.01 if r == 1 else 0.16)
                feed(StepRecord("r", step, time=t, rank=r, step_time=0.25, data_time=0.001,
                                sync_wait_time=sync))
        books.append(feed.book)
    assert books[0].to_state() == books[1].to_state()
    assert books[0].report() == books[1].report()


def test_a_straggler_tax_past_the_productive_time_takes_it_to_zero_not_below():
    """Steps of 50 ms, and the other ranks say they waited a second each in every
    all-reduce (no step time to cap it): the tax cannot take more than the productive
    time there was."""
    feed = Feed()
    for r in range(3):
        feed(RunRecord("r", time=T0, rank=r))
    t = T0
    for step in range(1, 13):
        t += 0.05
        for r in range(3):
            feed(StepRecord("r", step, time=t, rank=r, sync_wait_time=0.0 if r == 0 else 1.0))
    r = feed.book.report()
    assert r.productive == 0.0 and r.badput["straggler_collective"] == pytest.approx(0.6)
    _adds_up(r)


def _three_ranks(**steps: dict[int, dict]) -> GoodputLedger:
    """Ranks 0-2 stepping every 0.35 s for 10 steps; ``steps[f"r{rank}"]``: that rank's
    step fields (else 1 ms of data, 0.3 s of all-reduce wait, its step time 0.35 s)."""
    feed = Feed()
    for r in range(3):
        feed(RunRecord("r", time=T0, rank=r, labels={"hostname": "x" * 200 if r == 2 else "a"}))
    t = T0
    for step in range(1, 11):
        t += 0.35
        for r in range(3):
            fields = {"data_time": 0.001, "sync_wait_time": 0.3, "step_time": 0.35,
                      **steps.get(f"r{r}", {})}
            feed(StepRecord("r", step, time=t, rank=r, **fields))
    return feed.book


def test_a_wait_longer_than_its_step_counts_as_the_step_and_a_negative_one_as_none():
    capped = _three_ranks(r0={"sync_wait_time": 0.01}, r1={"sync_wait_time": 0.5},
                          r2={"sync_wait_time": 0.5})
    assert capped.report().straggler.seconds == pytest.approx(9 * (0.35 - 0.01))
    floored = _three_ranks(r0={"sync_wait_time": -0.2})
    assert floored.report().straggler.seconds == pytest.approx(9 * 0.3)


def test_a_rank_s_compute_is_its_step_less_its_waits_when_it_does_not_say():
    """No compute times: rank 0 loads each batch 0.3 s longer and the others wait for it.
    Its compute, its step less its two waits, is the others': the tax is data loading."""
    book = _three_ranks(r0={"data_time": 0.301, "sync_wait_time": 0.0})
    r = book.report()
    assert r.straggler.rank == 0 and r.straggler.parts["compute"] == pytest.approx(0.0)
    assert r.badput["straggler_data"] == pytest.approx(9 * 0.3)


def test_a_compute_time_that_is_not_a_number_is_left_out_like_none():
    said = _three_ranks(r1={"compute_time": math.inf})
    none = _three_ranks(r1={"compute_time": 0.0})
    assert said.to_state() == none.to_state()


def test_a_node_name_is_kept_to_128_characters():
    assert _three_ranks().to_state()["hosts"]["2"] == "x" * 128
