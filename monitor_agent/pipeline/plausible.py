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
units. A new rank's first step is judged the same way against the run's other ranks (their
latest step and pace): the ranks of one run step together, and a new rank's ``2**53`` would
otherwise carry the run's latest step there, and with it the check that refuses a
checkpoint from the future. Only the first rank of a new run accepts any step: there is
nothing to protect yet (a run resumed under a fresh sidecar starts wherever it is).

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

A new rank 3 of the same run, whose first step is ``2**53``::

    >>> third = parse_record({"kind": "step", "run_id": "r1", "step": 2**53, "time": 100.0,
    ...                       "rank": 3})
    >>> print(implausible_step(run, third, seen={}, max_jump=100_000, now=101.0))
    step: 9007199254740992 is implausible for run r1 rank 3: more than 100000 steps after the
    run's latest step 10, and the rank has no history of its own (max_step_jump=100000 plus
    the run's pace)
"""

from __future__ import annotations

from collections.abc import Collection

from monitor_agent.records.types import HangRecord, Record, RunRecord
from monitor_agent.runs.run_state import RankState, RunState

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
    whose = "its latest step"
    if latest < 0:  # a new rank: its first step is judged against the run's other ranks
        state = run.top_rank()
        latest = max([run.last_step, *(s for (r, _), s in seen.items() if r == record.run_id)])
        whose = "the run's latest step"
        if latest < 0:  # the run's first rank: nothing to protect yet
            seen[key] = max(seen.get(key, -1), record.step)
            return None
    allowed = latest + max_jump + _pace_allowance(run, state, now)
    if record.step > allowed:
        alone = ", and the rank has no history of its own" if whose != "its latest step" else ""
        return (f"step: {record.step} is implausible for run {record.run_id} rank {record.rank}: "
                f"more than {allowed - latest} steps after {whose} {latest}{alone} "
                f"(max_step_jump={max_jump} plus the run's pace)")
    seen[key] = max(seen.get(key, -1), record.step)
    return None


def forged_rank(run: RunState, record: Record,
                stepped: Collection[tuple[str, int, int]] = ()) -> str | None:
    """Why a hang report cannot be from the rank it names, or None: one at or past the
    world size the run record declared (``hardware.world_size``, a checked integer:
    records/schemas.py) is forged or misaddressed, and would put a rank that does not exist
    on the page (a negative rank is refused by the schema). A run that declares no world
    size takes hang reports only from ranks it has heard steps from (the watchdog starts at
    a rank's first step), here or earlier in the batch (``stepped``: (run id, attempt,
    rank)). A digest a node sidecar forwarded is checked the same way at the run's leader,
    which holds every node's steps.

        >>> from monitor_agent.records.schemas import parse_record
        >>> run = RunState.new("r1", now=0.0)
        >>> run.apply_run(parse_record({"kind": "run", "run_id": "r1",
        ...                             "hardware": {"world_size": 4}}))
        >>> hang = {"kind": "hang", "run_id": "r1", "step": 0, "time": 0.0, "stuck_seconds": 9.0}
        >>> print(forged_rank(run, parse_record({**hang, "rank": 7})))
        rank: 7 is not a rank of run r1 (its run record declares world_size 4)
        >>> print(forged_rank(RunState.new("r2", now=0.0), parse_record({**hang, "run_id": "r2"})))
        rank: 0 has sent run r2 no step, and the run declares no world_size: a hang report
        comes from a rank that stepped
    """
    if not isinstance(record, HangRecord):
        return None
    hardware = run.run.hardware if run.run is not None else {}
    size = hardware.get("world_size")
    if isinstance(size, int) and not isinstance(size, bool):
        if record.rank >= size:
            return (f"rank: {record.rank} is not a rank of run {record.run_id} (its run "
                    f"record declares world_size {size})")
        return None
    if record.rank in run.ranks or any(
            r == record.run_id and k == record.rank for r, _, k in stepped):
        return None
    return (f"rank: {record.rank} has sent run {record.run_id} no step, and the run declares "
            "no world_size: a hang report comes from a rank that stepped")


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
