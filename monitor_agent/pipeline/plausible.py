"""Is a record's step plausible for its run? One far-ahead step must not rewrite history.

Lateness ("this step is not newer than the last one, skip detection") and retention both
reason from a rank's latest step. A single record with ``step: 2**53`` would make every
later real step late (never analysed) and the whole history "old" (pruned). So a step may
be at most ``max_step_jump`` ahead of what the rank has sent, plus what the run's own pace
allows for the time it has been silent:

    allowed = latest + max_step_jump + 10 * pace * seconds_since_last_record

``pace`` is the rank's observed steps per second of sidecar time (so a client clock cannot
inflate it), and 10x covers a trainer that speeds up (smaller eval, warmed-up kernels) or
that skips logging. A client that was cut off by an outage resumes within that bound: its
gap grows with the time it was away. ``max_step_jump`` (default 100,000) is the floor for a
run too young to have a pace; a trainer that logs sparser than that sends ``step`` in its own
units. A new rank (no history) accepts any step: there is nothing to protect yet.

A rank at step 10 sends step 11, then step 2**53; the engine rejects the record a reason
is given for (the API answers 422 for it)::

    >>> from monitor_agent.records.schemas import parse_record
    >>> def step(n):
    ...     return parse_record({"kind": "step", "run_id": "r1", "step": n, "time": 100.0})
    >>> run = RunState.new("r1", now=100.0)
    >>> run.apply_step(step(10), arrival=100.0, buckets=(1.0,))
    >>> implausible_step(run, step(11), seen={}, max_jump=100_000, now=101.0) is None
    True
    >>> print(implausible_step(run, step(2**53), seen={}, max_jump=100_000, now=101.0))
    step: 9007199254740992 is implausible for run r1 rank 0: more than 100000 steps after its
    latest step 10 (max_step_jump=100000 plus the run's pace)
"""

from __future__ import annotations

from monitor_agent.pipeline.run_state import RankState, RunState
from monitor_agent.records.types import HangRecord, Record, RunRecord

PACE_HEADROOM = 10.0


def implausible_step(
    run: RunState, record: Record, seen: dict[tuple[str, int], int], max_jump: int, now: float
) -> str | None:
    """Why the record's step is implausible, or None; ``seen`` tracks the current batch."""
    if isinstance(record, RunRecord):
        return None
    key = (record.run_id, record.rank)
    state = run.ranks.get(record.rank)
    latest = max(state.last_step if state else -1, state.last_eval_step if state else -1,
                 seen.get(key, -1))
    if latest < 0:
        seen[key] = max(seen.get(key, -1), record.step)
        return None
    allowed = latest + max_jump + _pace_allowance(run, state, now)
    if record.step > allowed:
        return (f"step: {record.step} is implausible for run {record.run_id} rank {record.rank}: "
                f"more than {allowed - latest} steps after its latest step {latest} "
                f"(max_step_jump={max_jump} plus the run's pace)")
    seen[key] = max(seen.get(key, -1), record.step)
    return None


def forged_rank(run: RunState, record: Record) -> str | None:
    """Why a hang report cannot be from the rank it names, or None: one at or past the
    world size the run record declared (``hardware.world_size``) is forged or misaddressed,
    and would put a rank that does not exist on the page (a negative rank is refused by
    the schema).

        >>> from monitor_agent.records.schemas import parse_record
        >>> run = RunState.new("r1", now=0.0)
        >>> run.apply_run(parse_record({"kind": "run", "run_id": "r1",
        ...                             "hardware": {"world_size": 4}}))
        >>> hang = {"kind": "hang", "run_id": "r1", "step": 0, "time": 0.0, "stuck_seconds": 9.0}
        >>> print(forged_rank(run, parse_record({**hang, "rank": 7})))
        rank: 7 is not a rank of run r1 (its run record declares world_size 4)
    """
    if not isinstance(record, HangRecord):
        return None
    hardware = run.run.hardware if run.run is not None else {}
    size = hardware.get("world_size")
    if isinstance(size, int) and not isinstance(size, bool) and record.rank >= size:
        return (f"rank: {record.rank} is not a rank of run {record.run_id} (its run record "
                f"declares world_size {size})")
    return None


def _pace_allowance(run: RunState, state: RankState | None, now: float) -> int:
    if state is None:
        return 0
    first_step, first_arrival = state.first_step, state.first_arrival
    if first_arrival is None:
        # Restored after a restart: the pace since the run began, counting steps from 0
        # (a resumed run looks faster than it is, which only makes the bound kinder).
        first_step, first_arrival = 0, run.first_seen
    last_arrival = state.last_arrival or run.last_arrival  # 0.0 until a step after restore
    elapsed = last_arrival - first_arrival
    if elapsed <= 0 or state.last_step <= first_step:
        return 0
    pace = (state.last_step - first_step) / elapsed
    return int(PACE_HEADROOM * pace * max(now - last_arrival, 0.0))
