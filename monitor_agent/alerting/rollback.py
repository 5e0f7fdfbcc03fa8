"""``action: rollback``: go back to the last clean checkpoint and skip the data past the fault.

A rule with ``action: rollback`` decides **once per run** per fault, for every rank: the
first matching finding (from any rank) that makes the action due takes the decision; while
it is pending (not yet applied), no other finding of the run decides again, so two ranks
reporting the same divergence, or a finding replayed after a crash, get the one decision
already stored. The decision (``decide``) is a ``RollbackDecision`` whose plan (a
``RollbackSpec``, records/rollback_plan.py: its fields, parser and wording) says:

- ``checkpoint_step`` C and ``checkpoint_path``: the run's last clean checkpoint before
  the fault's onset (runs/checkpoint_ledger.py judges clean; only checkpoints of the
  run's current history are candidates, so one a restart replaced is never chosen);
- ``resume_position`` and ``skip``, in **data positions** (docs/format.md
  ``data_position``: batches, or samples, of the run's data stream consumed, counted over
  the whole run): the stream resumes after ``resume_position``, the position C's state
  left it at, and never trains the positions of any ``[first, last]`` window in ``skip``.
  The new window runs from ``resume_position + 1`` to the fault's position plus
  ``rollback_skip_margin`` steps' worth of positions (the rank's median per step). After a
  rollback, step and position differ (the resumed run jumped over a window), so a plan in
  steps would send the data back to the wrong place; and windows add up: ``skip`` also
  holds every window the run's earlier rollbacks skipped, so a second rollback to the
  same checkpoint never trains the first window again. A run that reports no data position
  gets the same plan counted in steps (``positions: "steps"``: one batch per step);
- ``skip_from`` = C + 1 .. ``skip_to`` = the fault's step + ``rollback_skip_margin``: the
  same window in steps, which is what applies the plan (below);
- ``skips_by``: how the run leaves the windows out, as its run record said (``data``): in
  a map-style dataset's batch sampler, or by reading past them in a stream; the page says
  which;
- ``lr_factor``/``lr_steps``: optionally, the LR is scaled for that many steps after;
- ``number`` (this run's n-th rollback) and ``budget`` (``rollback_budget``).

A rollback is *applied* when an attempt of the run settles at a step at or before its
``skip_from`` (the client resumes with a fresh attempt token at C + 1, pipeline/attempts.py);
``honoured_step`` is then that step and the next fault may decide again. What the resumed
run then trains is checked against ``skip`` (detectors/window_trained.py). Past the budget,
or with no clean checkpoint to go to, the action taken is ``stop``, and the page says why:
a run must not loop forever, and with nothing safe to go back to a human must look.

The plan is stored in the same transaction as the alert (``actions.plan``), so a sidecar
killed between the decision and its delivery serves the same plan after the restart.

A run at one batch per step, checkpointed at 11000 and 11800 (data positions 11000 and
11800), diverges at 12050; a first rollback had skipped batches 11301-11350 already::

    >>> from monitor_agent.records.types import Severity
    >>> rule = Rule(name="RollbackOnDivergence", types=("divergence",), channels=("console",),
    ...             cooldown=60, repeat_interval=3600, resolve_after=600, action="rollback",
    ...             rollback_lr_factor=0.5, rollback_lr_steps=500)
    >>> fault = Finding("divergence", Severity.ERROR, "gpt-7", step=12050, message="diverged",
    ...                 evidence={"onset_step": 11900})
    >>> clean = ((11000, "/ckpt/step-11000.pt"), (11800, "/ckpt/step-11800.pt"))
    >>> data = Positions(checkpoints={11000: 11000, 11800: 11850},
    ...                  latest={0: (12050, 12100, 1)}, skipped=((11301, 11350),))
    >>> plan = decide(rule, fault, clean, number=2, data=data).plan
    >>> plan.checkpoint_step, plan.resume_position, plan.skip
    (11800, 11850, ((11301, 11350), (11851, 12300)))
    >>> plan.describe()
    'rolled back to step 11800 (/ckpt/step-11800.pt, data position 11850), skipping batches 11301-11350, 11851-12300; LR x0.5 for 500 steps'
    >>> streamed = Positions(checkpoints={11800: 11850}, latest={0: (12050, 12100, 1)},
    ...                      skips_by="reading")
    >>> decide(rule, fault, clean, number=1, data=streamed).plan.describe()
    'rolled back to step 11800 (/ckpt/step-11800.pt, data position 11850), skipping batches 11851-12300 by reading past them (streamed data); LR x0.5 for 500 steps'
    >>> decide(rule, fault, clean, number=1).plan.describe()
    'rolled back to step 11800 (/ckpt/step-11800.pt), skipping batches 11801-12250 (counted as steps: the run reports no data position); LR x0.5 for 500 steps'
    >>> decide(rule, fault, clean, number=3)
    Stop(why='rollback budget 2 spent: stopping; a human must look')
    >>> decide(rule, fault, (), number=1)
    Stop(why='no clean checkpoint to roll back to: stopping; a human must look')
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import RollbackDecision, RollbackSpec, Stop
from monitor_agent.records.types import Finding

__all__ = ["ROLLBACK_WAIT_LIMIT_SECONDS", "ROLLBACK_WAIT_SECONDS", "Positions", "behind",
           "decide", "merge", "onset_of"]

ROLLBACK_WAIT_SECONDS = 5.0
"""How long a rollback decision waits without news of the ranks that report checkpoints
while they are behind the fault's onset (``behind``). Each rank posts on its own queue, and
another node's ranks reach the leader through their own sidecar, so one rank's finding can
arrive before another rank's save before the fault (a run saved at 50 and 60, corrupt from
61: deciding at once went back to 50), or before its own finding of an earlier onset (DDP
spreads node 1's bad batch to every rank's weights, and rank 0's loss leaves its band a few
steps later: decided on rank 0's onset, the plan went back to a save node 1's onset had
made suspect). A client posts every ``linger`` (0.5 s) and retries within a second; 5 s
without any news of them covers that, then the decision takes what is known (a rank that
died or hangs sends nothing more; the nan_inf first-rank wait is the same)."""

ROLLBACK_WAIT_LIMIT_SECONDS = 60.0
"""How long a rollback waits at most while the awaited ranks' records keep coming (a node
sidecar starved of CPU, or catching up after its leader was away, forwards steps late but
forwards them): a plan decided on part of the job's view goes back to the wrong save, and
the job then pays a second rollback. Past a minute the view is taken as it is."""


@dataclass(frozen=True, slots=True)
class Positions:
    """What a plan in data positions needs to know of the run (``RunContext``): each clean
    checkpoint's position (step -> position), each rank's latest (step, position,
    positions per step), and the windows its applied rollbacks skip already."""

    checkpoints: Mapping[int, int] = field(default_factory=dict)
    latest: dict[int, tuple[int, int, int]] = field(default_factory=dict)
    skipped: tuple[tuple[int, int], ...] = ()
    skipped_unit: str = "positions"  # what ``skipped`` counts: "positions" or "steps"
    # How the run leaves a window out (its run record's ``data.skips_by``): "sampler" (a
    # map-style dataset's batch sampler) or "reading" (a stream, read past); None: unsaid.
    skips_by: str | None = None


def onset_of(finding: Finding) -> int:
    """Where the fault began: ``evidence["onset_step"]`` when the detector gives one."""
    onset = finding.evidence.get("onset_step", finding.step)
    if not isinstance(onset, int) or isinstance(onset, bool) or onset > finding.step:
        return finding.step
    return onset


def behind(ranks: dict[int, int], checkpoint_ranks: tuple[int, ...],
           finding: Finding) -> list[int]:
    """The ranks whose checkpoints before the fault's onset may not have arrived yet: those
    that report checkpoints (every rank heard, before any did) whose latest step is before
    the onset. A rank's checkpoint records travel in order with its steps, so once its step
    at the onset is here, so is every save before it (and its own findings up to it).

        >>> from monitor_agent.records.types import Severity
        >>> fault = Finding("divergence", Severity.ERROR, "r", step=66, message="",
        ...                 evidence={"onset_step": 61})
        >>> behind({0: 59, 1: 66}, (0,), fault), behind({0: 61, 1: 66}, (0,), fault)
        ([0], [])
        >>> behind({0: 70, 1: 66, 3: -1}, (), fault)   # rank 3 sent evaluations only
        []
    """
    onset = onset_of(finding)
    # A rank heard only through evaluations (-1: no step yet) reports no steps to wait for.
    who = checkpoint_ranks or tuple(r for r, step in ranks.items() if step >= 0)
    return sorted(r for r in who if ranks.get(r, -1) < onset)


def merge(windows: list[tuple[int, int]] | tuple[tuple[int, int], ...]) -> list[list[int]]:
    """Inclusive ``[first, last]`` windows, sorted, overlapping or adjacent ones joined.

        >>> merge([(301, 330), (320, 355), (356, 360), (100, 120)])
        [[100, 120], [301, 360]]
    """
    out: list[list[int]] = []
    for first, last in sorted((int(a), int(b)) for a, b in windows if int(b) >= int(a)):
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return out


def decide(rule: Rule, finding: Finding, clean: Sequence[tuple[int, str]],
           number: int, data: Positions | None = None) -> RollbackDecision | Stop:
    """``RollbackDecision`` (its plan) or ``Stop`` (why): the ``number``-th rollback of the
    run for the fault ``finding``, given its clean checkpoints (oldest first) and what it
    reported of its data positions (``data``; None or empty: the plan counts steps)."""
    if number > rule.rollback_budget:
        return Stop(f"rollback budget {rule.rollback_budget} spent: stopping; a human must look")
    onset = onset_of(finding)
    before = [(step, path) for step, path in clean if step < onset]
    if not before:
        return Stop("no clean checkpoint to roll back to: stopping; a human must look")
    step, path = before[-1]
    margin = rule.rollback_skip_margin
    skip_to = max(finding.step + margin, step + 1)
    data = data or Positions()
    resume = data.checkpoints.get(step)
    place = data.latest.get(finding.rank) or (min(data.latest.values()) if data.latest else None)
    if resume is not None and place is not None:
        last_step, last_position, per_step = place
        at_fault = last_position - max(last_step - finding.step, 0) * per_step
        window = (resume + 1, max(at_fault + margin * per_step, resume + 1))
        unit = "positions"
    else:  # the run reports no data position: one batch per step, as the loop counts them
        resume, window, unit = step, (step + 1, skip_to), "steps"
    earlier = data.skipped if data.skipped_unit == unit else ()
    factor = rule.rollback_lr_factor
    return RollbackDecision(RollbackSpec(
        checkpoint_step=step, checkpoint_path=path, resume_position=resume,
        skip=tuple((a, b) for a, b in merge([*earlier, window])), positions=unit,
        skips_by=data.skips_by if unit == "positions" else None,
        skip_from=step + 1, skip_to=skip_to, lr_factor=factor,
        lr_steps=rule.rollback_lr_steps if factor is not None else None,
        number=number, budget=rule.rollback_budget))
