"""``action: rollback``: go back to the last clean checkpoint and skip the data past the fault.

A rule with ``action: rollback`` decides **once per run** per fault, for every rank: the
first matching finding (from any rank) that makes the action due takes the decision; while
it is pending (not yet applied), no other finding of the run decides again, so two ranks
reporting the same divergence, or a finding replayed after a crash, get the one decision
already stored. The decision is an ``Action`` whose ``plan`` says:

- ``checkpoint_step`` C and ``checkpoint_path``: the run's last clean checkpoint before
  the fault's onset (pipeline/checkpoint_ledger.py judges clean; only checkpoints of the
  run's current history are candidates, so one a restart replaced is never chosen);
- ``skip_from`` = C + 1 .. ``skip_to`` = the fault's step + ``rollback_skip_margin``: the
  batches the loop must never train on (its data loader is fast-forwarded by
  ``skip_to - C`` batches after reloading C);
- ``lr_factor``/``lr_steps``: optionally, the LR is scaled for that many steps after;
- ``number`` (this run's n-th rollback) and ``budget`` (``rollback_budget``).

A rollback is *applied* when an attempt of the run settles at a step at or before its
``skip_from`` (the client resumes with a fresh attempt token at C + 1, pipeline/attempts.py);
``honoured_step`` is then that step and the next fault may decide again. Past the budget,
or with no clean checkpoint to go to, the action taken is ``stop``, and the page says why:
a run must not loop forever, and with nothing safe to go back to a human must look.

The plan is stored in the same transaction as the alert (``actions.plan``), so a sidecar
killed between the decision and its delivery serves the same plan after the restart.

    >>> from monitor_agent.records.types import Severity
    >>> rule = Rule(name="RollbackOnDivergence", types=("divergence",), channels=("console",),
    ...             cooldown=60, repeat_interval=3600, resolve_after=600, action="rollback",
    ...             rollback_lr_factor=0.5, rollback_lr_steps=500)
    >>> fault = Finding("divergence", Severity.ERROR, "gpt-7", step=12050, message="diverged",
    ...                 evidence={"onset_step": 11900})
    >>> clean = ((11000, "/ckpt/step-11000.pt"), (11800, "/ckpt/step-11800.pt"))
    >>> action, plan = decide(rule, fault, clean, number=1)
    >>> action, plan["checkpoint_step"], plan["skip_from"], plan["skip_to"]
    ('rollback', 11800, 11801, 12250)
    >>> describe(plan)
    'rolled back to step 11800 (/ckpt/step-11800.pt), skipping batches 11801-12250; LR x0.5 for 500 steps'
    >>> decide(rule, fault, clean, number=3)
    ('stop', 'rollback budget 2 spent: stopping; a human must look')
    >>> decide(rule, fault, (), number=1)
    ('stop', 'no clean checkpoint to roll back to: stopping; a human must look')
"""

from __future__ import annotations

from typing import Any

from monitor_agent.alerting.rules import Rule
from monitor_agent.records.types import Finding

__all__ = ["decide", "describe", "onset_of"]


def onset_of(finding: Finding) -> int:
    """Where the fault began: ``evidence["onset_step"]`` when the detector gives one."""
    onset = finding.evidence.get("onset_step", finding.step)
    if not isinstance(onset, int) or isinstance(onset, bool) or onset > finding.step:
        return finding.step
    return onset


def decide(rule: Rule, finding: Finding, clean: tuple[tuple[int, str], ...],
           number: int) -> tuple[str, dict[str, Any] | str]:
    """("rollback", plan) or ("stop", why): the ``number``-th rollback of the run for the
    fault ``finding``, given its clean checkpoints (oldest first)."""
    if number > rule.rollback_budget:
        return "stop", f"rollback budget {rule.rollback_budget} spent: stopping; a human must look"
    onset = onset_of(finding)
    before = [(step, path) for step, path in clean if step < onset]
    if not before:
        return "stop", "no clean checkpoint to roll back to: stopping; a human must look"
    step, path = before[-1]
    return "rollback", {
        "checkpoint_step": step, "checkpoint_path": path, "skip_from": step + 1,
        "skip_to": max(finding.step + rule.rollback_skip_margin, step + 1),
        "lr_factor": rule.rollback_lr_factor,
        "lr_steps": rule.rollback_lr_steps if rule.rollback_lr_factor is not None else None,
        "number": number, "budget": rule.rollback_budget,
    }


def describe(plan: dict[str, Any]) -> str:
    """The sentence pages carry about a rollback."""
    text = (f"rolled back to step {plan['checkpoint_step']} ({plan['checkpoint_path']}), "
            f"skipping batches {plan['skip_from']}-{plan['skip_to']}")
    if plan.get("lr_factor") is not None:
        text += f"; LR x{plan['lr_factor']:g} for {plan['lr_steps']} steps"
    return text
