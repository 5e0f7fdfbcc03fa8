"""How far a run is and when it will be done, from ``total_steps`` or ``total_tokens``.

The run record's ``config.total_steps`` (optimizer steps) is the plan when given; otherwise
``config.total_tokens`` (tokens of the whole run, all ranks together). The ETA divides what
is left by the run's own pace so far (mean step time, or tokens per second of step time)
and exists only while the run is running.

A run planned for 100 steps is at step 25, its steps taking 2 s: a quarter done, 75 steps
(150 s) to go::

    >>> from monitor_agent.records.schemas import parse_record
    >>> run = RunState.new("r1", now=0.0)
    >>> run.apply_run(parse_record({"kind": "run", "run_id": "r1",
    ...                             "config": {"total_steps": 100}}))
    >>> step = {"kind": "step", "run_id": "r1", "step": 25, "time": 50.0, "step_time": 2.0}
    >>> run.apply_step(parse_record(step), arrival=50.0, buckets=(1.0, 5.0))
    >>> run_progress(run, run.ranks[0])
    Progress(ratio=0.25, basis='steps', eta_seconds=150.0)
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor_agent.runs.run_state import RankState, RunState


@dataclass(frozen=True, slots=True)
class Progress:
    """``ratio`` in 0..1; ``basis`` is ``steps`` or ``tokens``; ``eta_seconds`` or None."""

    ratio: float
    basis: str
    eta_seconds: float | None = None


def _planned(run: RunState, key: str) -> float | None:
    value = run.run.config.get(key) if run.run is not None else None
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return float(value)
    return None


def run_progress(run: RunState, state: RankState) -> Progress | None:
    """Progress of ``run`` as seen by one of its ranks; None when the run has no plan."""
    total = _planned(run, "total_steps")
    if total is not None:
        return _by_steps(run, state, total)
    total = _planned(run, "total_tokens")
    return _by_tokens(run, total) if total is not None else None


def _going(run: RunState) -> bool:
    """Whether the run makes progress an ETA can extrapolate: running, not silent (a
    process that died leaves no time to go)."""
    return run.status == "running" and run.phase_state != "silent"


def _by_steps(run: RunState, state: RankState, total: float) -> Progress | None:
    if state.last_step < 0:
        return None
    counted = sum(state.step_time_counts)
    eta = None
    if _going(run) and counted:
        eta = max(total - state.last_step, 0) * state.step_time_sum / counted
    return Progress(min(state.last_step / total, 1.0), "steps", eta)


def _by_tokens(run: RunState, total: float) -> Progress | None:
    ranks = list(run.ranks.values())
    done = sum(r.tokens_total for r in ranks)
    if not ranks or done <= 0:
        return None
    # Ranks work in parallel: the run's pace is its tokens over the slowest rank's time.
    busy = max(r.step_time_sum for r in ranks)
    eta = None
    if _going(run) and busy > 0:
        eta = max(total - done, 0.0) / (done / busy)
    return Progress(min(done / total, 1.0), "tokens", eta)
