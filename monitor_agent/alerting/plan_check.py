"""What an action may say: the check a node sidecar makes of each action it adopts from
its run's leader (serving/leader_link.py), as the client makes of each plan it receives
(client/monitor_client/_rollback.py ``RollbackSpec.problem``).

A leader decides a run's actions and every node's ranks carry them out; a plan whose
``lr_factor`` is NaN, negative or 1e308 would make their LR nan, negative or absurd, and a
window of 10**15 positions would skip the rest of the run's data. So an adopted action is
what this sidecar's own rules could have decided (alerting/rules.py: ``rollback_lr_factor``
in (0, 1], ``rollback_lr_steps`` and ``rollback_skip_margin`` at most 10,000,000) about the
run as this sidecar knows it: its checkpoint no later than the run's latest step, its
windows starting no later than the run's latest data position (each with the slack a
checkpoint record has, ``CHECKPOINT_STEP_SLACK``), and ending within the margin's reach.
Every plan must parse whole first (records/rollback_plan.py, records/restart_plan.py: the
one parser each, which holds a rule's bounds). An
action that is not is dropped, with the reason logged; the leader's others are kept.

    >>> bounds = RunBounds(latest_step=120, latest_position=120, per_step=1)
    >>> plan = {"checkpoint_step": 100, "checkpoint_path": "/c/100.pt", "skip_from": 101,
    ...         "skip_to": 140, "skip": [[101, 140]], "resume_position": 100,
    ...         "positions": "positions", "lr_factor": 0.5, "lr_steps": 20}
    >>> action_problem({"id": 2, "action": "rollback", "step": 110, "plan": plan}, bounds)
    >>> print(action_problem({"id": 2, "action": "rollback", "step": 110,
    ...                       "plan": {**plan, "lr_factor": 1e308}}, bounds))
    plan.lr_factor: 1e+308 is not a finite number in (0, 1]
    >>> print(action_problem({"id": 2, "action": "rollback", "step": 110,
    ...                       "plan": {**plan, "skip": [[101, 10**15]]}}, bounds))
    plan.skip: window [101, 1000000000000000] ends past what the run can skip (its latest position 120 + 10000000 steps of 1 positions)

A restart (every rank leaves with exit 75) is adopted so that this node's ranks leave too,
even when its resume point is past the latest step heard here (a frozen rank's node lags):

    >>> restart = {"cause": "hang", "fault_step": 115, "ranks": 8, "nodes": 2,
    ...            "checkpoint_step": 100, "checkpoint_path": "/c/100.pt"}
    >>> action_problem({"id": 3, "action": "restart", "step": 115, "plan": restart}, bounds)
    >>> print(action_problem({"id": 3, "action": "exclude", "step": 115,
    ...                       "plan": {"cause": "hang"}}, bounds))
    plan: not a whole restart plan
    >>> action_problem({"id": 3, "action": "restart", "step": 125,
    ...                 "plan": {**restart, "checkpoint_step": 122}}, bounds)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from monitor_agent.records.actions import ACTIONS, RESTART_ACTIONS, RestartPlan
from monitor_agent.records.rollback_plan import MAX_COUNT, MAX_WINDOWS, PlanError, RollbackSpec

MAX_MARGIN_STEPS = 10_000_000  # rules.py: rollback_skip_margin and rollback_lr_steps
MAX_TEXT = 4096
CHECKPOINT_STEP_SLACK = 1  # as far as a checkpoint record may be ahead of the latest step
                           # (runs/checkpoint_ledger.py, a layer above this one)


@dataclass(frozen=True, slots=True)
class RunBounds:
    """The run as this sidecar knows it: its latest step, its latest data position (None
    when it reports none) and the most positions a step of it takes."""

    latest_step: int
    latest_position: int | None
    per_step: int = 1


def action_problem(action: dict[str, Any], run: RunBounds | None) -> str | None:
    """Why ``action`` (``GET /v1/runs/{id}/actions``' item) is not one this sidecar's
    rules could decide about ``run`` (None: a run not known here; only its own ranges are
    checked), or None."""
    if action.get("action") not in ACTIONS:
        return f"action: {str(action.get('action'))[:40]!r} is not one of {', '.join(ACTIONS)}"
    for key in ("id", "step"):
        if not _count(action.get(key), 1 if key == "id" else 0):
            return f"{key}: not an integer in range"
    for key in ("rule", "type", "message"):
        value = action.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_TEXT):
            return f"{key}: not a string of at most {MAX_TEXT} characters"
    plan = action.get("plan")
    if action["action"] in RESTART_ACTIONS:
        return _restart_problem(plan, run)
    if action["action"] != "rollback":
        return None if plan is None else "plan: only a rollback, restart or exclude has one"
    try:  # the one parser every reader uses (records/rollback_plan.py), with a rule's bounds
        parsed = RollbackSpec.parse(plan)
    except PlanError as exc:
        return f"plan: {exc}" if plan is None or not isinstance(plan, dict) else f"plan.{exc}"
    why = None if run is None else _beyond(parsed, run)
    return None if why is None else f"plan.{why}"


def _restart_problem(plan: Any, run: RunBounds | None) -> str | None:
    """Why a restart's or exclusion's plan is not one this sidecar's rules could decide:
    not a whole plan (records/restart_plan.py parses it, as every reader does). Its resume point
    is not bounded by the run's steps as known here: the node of a frozen rank lags behind
    the checkpoint the others saved, and its ranks must leave too (the client loads only a
    checkpoint inside the job's own checkpoint directory: ``Monitor.resume_plan``)."""
    parsed = RestartPlan.from_dict(plan)
    if parsed is None:
        return "plan: not a whole restart plan"
    if len(parsed.skip) > MAX_WINDOWS:
        return f"plan.skip: more than {MAX_WINDOWS} windows"
    return None


def _beyond(plan: RollbackSpec, run: RunBounds) -> str | None:
    """Why the plan reaches past the run's data as known here, or None."""
    if plan.checkpoint_step > run.latest_step + CHECKPOINT_STEP_SLACK:
        return (f"checkpoint_step: {plan.checkpoint_step} is past the run's latest step "
                f"{run.latest_step}")
    if plan.skip_to > run.latest_step + MAX_MARGIN_STEPS:
        return f"skip_to: {plan.skip_to} is past the run's latest step + the margin"
    in_steps = plan.positions == "steps" or run.latest_position is None
    latest = run.latest_step if in_steps else run.latest_position
    per = 1 if in_steps else max(run.per_step, 1)
    assert latest is not None
    for first, last in plan.skip:
        if first > latest + 1 + CHECKPOINT_STEP_SLACK * per:
            return f"skip: window [{first}, {last}] starts past the run's latest {latest}"
        if last > latest + MAX_MARGIN_STEPS * per:
            return (f"skip: window [{first}, {last}] ends past what the run can skip (its "
                    f"latest position {latest} + {MAX_MARGIN_STEPS} steps of {per} positions)")
    return None


def _count(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_COUNT
