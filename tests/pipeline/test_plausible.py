"""Plausible steps: a far-ahead step is refused, a gap the run's own pace explains is not."""

from __future__ import annotations

from monitor_agent.pipeline.plausible import implausible_step
from monitor_agent.records.types import StepRecord
from monitor_agent.runs.run_state import RunState


def _step(step: int, rank: int = 0) -> StepRecord:
    return StepRecord(run_id="r", step=step, time=0.0, rank=rank)


def _run_with_history(steps: int, seconds: float) -> RunState:
    """A run that logged ``steps`` steps, one per ``seconds / steps``, from t=1000."""
    run = RunState.new("r", now=1000.0)
    for s in range(1, steps + 1):
        rec = StepRecord(run_id="r", step=s, time=float(s), rank=0)
        run.apply_step(rec, arrival=1000.0 + s * seconds / steps, buckets=(1.0,))
    return run


def test_a_new_run_s_first_rank_accepts_any_step_and_the_batch_counts_as_history():
    run, seen = RunState.new("r", now=0.0), {}
    assert implausible_step(run, _step(2**53 - 1), seen, 1000, now=0.0) is None
    assert implausible_step(run, _step(2**53), {("r", 0): 5}, 1000, now=0.0) is not None


def test_a_new_rank_of_a_running_run_is_judged_against_its_other_ranks():
    run = _run_with_history(300, seconds=300.0)
    reason = implausible_step(run, _step(2**53, rank=7), {}, 1000, now=1300.0)
    assert reason and "rank 7" in reason and "the run's latest step 300" in reason
    assert implausible_step(run, _step(301, rank=7), {}, 1000, now=1300.0) is None
    # The batch's own steps of other ranks count as the run's history too.
    fresh = RunState.new("r", now=0.0)
    assert implausible_step(fresh, _step(2**53, rank=1), {("r", 0): 5}, 1000, now=0.0)


def test_far_ahead_is_refused_within_the_jump_is_not():
    run = _run_with_history(300, seconds=300.0)
    assert implausible_step(run, _step(300 + 1000), {}, 1000, now=1300.0) is None
    reason = implausible_step(run, _step(2**53), {}, 1000, now=1300.0)
    assert reason and "implausible" in reason and "max_step_jump=1000" in reason


def test_a_long_silence_allows_what_the_pace_explains():
    run = _run_with_history(300, seconds=300.0)  # 1 step/s
    hour_later = 1300.0 + 3600
    assert implausible_step(run, _step(300 + 3600), {}, 1000, now=hour_later) is None
    assert implausible_step(run, _step(300 + 100 * 3600), {}, 1000, now=hour_later)


def test_after_a_restart_the_pace_comes_from_the_run():
    run = RunState.new("r", now=1000.0)
    run.last_arrival = 1300.0
    run.rank(0).last_step = 300  # restored counters: no arrival times of its own
    assert implausible_step(run, _step(300 + 3600), {}, 1000, now=1300.0 + 3600) is None
    assert implausible_step(run, _step(300 + 3600), {}, 1000, now=1300.0)
