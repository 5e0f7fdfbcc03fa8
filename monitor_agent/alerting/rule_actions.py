"""Actions back to the trainer: a rule may ask the run to ``stop``, to ``checkpoint``, to
``rollback`` (to its last clean checkpoint, skipping the data past the fault: decided
once per run, see alerting/rollback.py), or to ``restart`` every rank through its launcher,
with ``exclude``: leaving a sick node out (alerting/restart.py).

An action is taken once per alert episode, when the episode's ``action_after``-th matching
finding arrives (``action_after: 3`` on ``nan_inf`` = "stop on repeated NaN"). It is
stored in the alert database in the same transaction as the alert state, remembered on
the alert so every page of that alert says what was done, returned to the client in the
ingest response, and served by ``GET /v1/runs/{run_id}/actions`` for ranks and pollers
that did not post the record.

A stop is only a request until the trainer honours it, some steps later (the client sees
it on its next answer or poll). So the page first says "stop requested at step N by rule
R"; when the run's end record arrives with status ``stopped``, its step is the step the
trainer stopped at (``honoured``), and the alert then says "run stopped at step M by rule
R (stop requested at step N)".

A stop the trainer never honours (its loop never asks ``should_stop()``, or goes on after
it) is not reported as honoured: when the run ends ``completed`` or ``failed`` with the stop
open, its alert says "stop requested at step N by rule R, not honoured: the run went on to
step M and ended completed" (``ignored_stops``).

A rule that stops a run on its second NaN, the stop it asks for, and the trainer
honouring it two steps later::

    >>> from monitor_agent.alerting.alert_store import AlertStore
    >>> from monitor_agent.alerting.db import open_alert_db
    >>> from monitor_agent.records.types import Severity
    >>> rule = Rule(name="StopOnRepeatedNaN", types=("nan_inf",), channels=("console",),
    ...             cooldown=60, repeat_interval=3600, resolve_after=600, action="stop",
    ...             action_after=2)
    >>> due(rule, count=1), due(rule, count=2)
    (False, True)
    >>> store = AlertStore(open_alert_db(":memory:"))
    >>> nan = Finding("nan_inf", Severity.CRITICAL, "gpt-7", step=300, message="loss is NaN")
    >>> with store.tx() as tx:
    ...     stop = take(tx, rule, nan, fingerprint="ab12", now=1000.0)
    ...     honoured = honour_stops(tx, "gpt-7", step=302)
    >>> stop.message
    'stop requested at step 300 by rule StopOnRepeatedNaN'
    >>> [(a.id, a.honoured_step, a.message) for a in store.actions_for_run("gpt-7")]
    [(1, 302, 'run stopped at step 302 by rule StopOnRepeatedNaN (stop requested at step 300)')]
"""

from __future__ import annotations

import logging
from dataclasses import replace

from monitor_agent.alerting import restart, rollback
from monitor_agent.alerting.alert_store import AlertTx
from monitor_agent.alerting.alerts import RunContext
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import ACTIONS, RESTART_ACTIONS, Action, Hold, Restart, Stop
from monitor_agent.records.types import Finding

__all__ = ["ACTIONS", "Action", "applied_restarts", "applied_rollbacks", "describe", "due",
           "honour_stops", "ignored_stops", "take"]

log = logging.getLogger(__name__)


def describe(action: str, step: int, rule: str, honoured_step: int | None = None,
             ended: tuple[str, int] | None = None) -> str:
    """The sentence pages carry, so whoever is paged knows what the run did about it
    (``ended``: how and where a run that never honoured its stop ended)."""
    if action == "stop" and honoured_step is not None:
        return f"run stopped at step {honoured_step} by rule {rule} (stop requested at step {step})"
    if action == "stop" and ended is not None:
        return (f"stop requested at step {step} by rule {rule}, not honoured: the run went on "
                f"to step {ended[1]} and ended {ended[0]}")
    return f"{action} requested at step {step} by rule {rule}"


def due(rule: Rule, count: int) -> bool:
    """Whether the ``count``-th finding of an episode triggers the rule's action.

    A rollback is due on every finding from the ``action_after``-th on: the episode outlives
    a rollback (its alert stays open while the resumed run goes on), and a fault that comes
    back after the resume must decide again; ``take`` keeps it to one decision per fault
    (none while one is pending) and one stop."""
    if rule.action in ("rollback", *RESTART_ACTIONS):
        return count >= rule.action_after
    return rule.action in ACTIONS and count == rule.action_after


def take(tx: AlertTx, rule: Rule, finding: Finding, fingerprint: str, now: float,
         run: RunContext | None = None) -> Action | None:
    """Record the action inside the caller's transaction and note it on the alert; None
    when a rollback is already pending for the run (decided once: alerting/rollback.py)."""
    if rule.action == "rollback":
        return _rollback(tx, rule, finding, fingerprint, now, run or RunContext(finding.run_id))
    if rule.action in RESTART_ACTIONS:
        return _restart(tx, rule, finding, fingerprint, now, run or RunContext(finding.run_id))
    action = Action(id=0, run_id=finding.run_id, action=rule.action, rule=rule.name,
                    type=finding.type, step=finding.step,
                    message=describe(rule.action, finding.step, rule.name), created_at=now)
    return tx.add_action(action, fingerprint)


def _rollback(tx: AlertTx, rule: Rule, finding: Finding, fingerprint: str, now: float,
              run: RunContext) -> Action | None:
    pending = tx.pending_rollbacks(finding.run_id)
    if pending:  # another rank's finding, or this one replayed: decided already, and this
        tx.note_action(fingerprint, pending[-1][0].message)  # alert's pages say so too
        return None
    if tx.has_action(finding.run_id, rule.name, "stop"):
        return None
    if finding.attempt < run.attempt:
        # A late rank's record of the history a rollback or restart replaced: the weights
        # it judged are gone, and the run's current ones are judged on their own records.
        tx.note_action(fingerprint, f"no rollback: the finding is of attempt "
                                    f"{finding.attempt}, before the run's attempt {run.attempt}")
        return None
    fault = restart.fault_of(finding, run)
    history = _history(tx, finding.run_id)
    if restart.repeated(rule, fault, run, history, now) is not None:
        # The same node at fault in a second incident: the node, not the data (a run on
        # one node cannot tell them apart, and keeps rolling back).
        healed = _decided(tx, rule, finding, fingerprint, now,
                          restart.decide(rule, finding, run, history, now))
        if healed is not None:
            return healed
    number = len(tx.rollbacks(finding.run_id)) + 1
    decision = rollback.decide(rule, finding, run.clean_checkpoints, number, rollback.Positions(
        run.checkpoint_positions, run.data, run.skipped, run.skipped_unit, run.skips_by))
    if isinstance(decision, Stop):
        action = Action(id=0, run_id=finding.run_id, action="stop", rule=rule.name,
                        type=finding.type, step=finding.step,
                        message=f"{decision.why} (rule {rule.name}, {finding.type} at step "
                                f"{finding.step})", created_at=now)
    else:
        plan = decision.plan
        if fault.node is not None and len(run.nodes) > 1:  # what a later incident compares
            plan = replace(plan, fault_node=fault.node, fault_host=next(
                (n.host for n in run.nodes if n.node == fault.node), None))
        action = Action(id=0, run_id=finding.run_id, action=decision.kind, rule=rule.name,
                        type=finding.type, step=finding.step, message=plan.describe(),
                        created_at=now, plan=plan)
    return tx.add_action(action, fingerprint)


def _restart(tx: AlertTx, rule: Rule, finding: Finding, fingerprint: str, now: float,
             run: RunContext) -> Action | None:
    pending = tx.pending_restarts(finding.run_id)
    if pending:  # every rank's hang report, or the hang repeating: decided already
        tx.note_action(fingerprint, pending[-1][0].message)
        return None
    if tx.has_action(finding.run_id, rule.name, "stop"):
        return None
    if finding.attempt < run.attempt or run.relaunching:
        # A fault of a job its launcher relaunches already (a crashed rank's group is
        # restarted by torchrun on its own): restarting would hit the new processes.
        tx.note_action(fingerprint, f"no restart: the job is being relaunched already "
                                    f"(attempt {run.attempt} began)")
        return None
    decision = restart.decide(rule, finding, run, _history(tx, finding.run_id), now)
    return _decided(tx, rule, finding, fingerprint, now, decision)


def _decided(tx: AlertTx, rule: Rule, finding: Finding, fingerprint: str, now: float,
             decision: Restart | Stop | Hold) -> Action | None:
    """Store a restart decision (``Hold``: noted on the alert, no action)."""
    about = f"rule {rule.name}, {finding.type} at step {finding.step}"
    if isinstance(decision, Hold):
        tx.note_action(fingerprint, f"{decision.why} ({about})")
        log.warning("run %s: %s (%s)", finding.run_id, decision.why, about)
        return None
    if isinstance(decision, Stop):
        if tx.has_action(finding.run_id, rule.name, "stop"):
            return None
        action = Action(id=0, run_id=finding.run_id, action="stop", rule=rule.name,
                        type=finding.type, step=finding.step,
                        message=f"{decision.why} ({about})", created_at=now)
        return tx.add_action(action, fingerprint)
    action = Action(id=0, run_id=finding.run_id, action=decision.kind, rule=rule.name,
                    type=finding.type, step=finding.step,
                    message=f"{decision.plan.describe()} ({about})", created_at=now,
                    plan=decision.plan)
    return tx.add_action(action, fingerprint)


def _history(tx: AlertTx, run_id: str) -> list[restart.Past]:
    """The run's healing actions as a restart decision weighs them (oldest first)."""
    out = []
    for action, _ in tx.healing(run_id):
        rolled = action.rollback  # a rollback's fault node: it has no RestartPlan
        out.append(restart.Past(
            at=action.created_at, kind=action.action, plan=action.restart,
            honoured_step=action.honoured_step,
            fault_node=rolled.fault_node if rolled is not None else None,
            fault_host=rolled.fault_host if rolled is not None else None,
            fault_step=action.step, cause=action.type))
    return out


def applied_restarts(tx: AlertTx, run_id: str, start_step: int, now: float,
                     started: float) -> list[Action]:
    """An attempt of the run that began at ``started`` settled at ``start_step`` (now):
    the job was relaunched, so its pending restarts decided before it began were carried
    out (``honoured_step``), and their alerts say when training resumed. One decided after
    it began was not (the attempt's first record came before it: a node's ranks whose
    launcher had relaunched them already)."""
    done = []
    for old, fingerprint in tx.pending_restarts(run_id):
        plan = old.restart
        if plan is None or old.created_at > started:
            continue
        took = max(now - old.created_at, 0.0)
        message = (f"{plan.describe(done=True)}; training resumed at step {start_step}, "
                   f"{took:.0f} s after the decision")
        new = replace(old, honoured_step=start_step, message=message)
        tx.honour(old, new, fingerprint)
        done.append(new)
    return done


def applied_rollbacks(tx: AlertTx, run_id: str, start_step: int) -> list[Action]:
    """An attempt of the run settled at ``start_step``: its pending rollbacks whose window
    begins at or after it are applied there (``honoured_step``)."""
    done = []
    for old, fingerprint in tx.pending_rollbacks(run_id):
        plan = old.rollback
        if plan is not None and start_step <= plan.skip_from:
            new = replace(old, honoured_step=start_step)
            tx.honour(old, new, fingerprint)
            done.append(new)
    return done


def honour_stops(tx: AlertTx, run_id: str, step: int) -> list[Action]:
    """The run ended ``stopped`` at ``step``: settle its open stop requests, reword alerts."""
    done = []
    for old, fingerprint in tx.open_stops(run_id, step):
        new = replace(old, message=describe("stop", old.step, old.rule, step), honoured_step=step)
        tx.honour(old, new, fingerprint)
        done.append(new)
    return done


def ignored_stops(tx: AlertTx, run_id: str, status: str, step: int) -> list[Action]:
    """The run ended ``status`` (not ``stopped``) at ``step`` with stop requests open: the
    trainer never honoured them. Their alerts say so; they stay unhonoured."""
    done = []
    for old, fingerprint in tx.open_stops(run_id, step):
        new = replace(old, message=describe("stop", old.step, old.rule, ended=(status, step)))
        tx.honour(old, new, fingerprint)
        done.append(new)
    return done
