"""A run's lifecycle: one state machine from its first record to its end, across attempts,
rollbacks and stops.

A run id's story is told by several parts (its attempts in the store, the actions in the
alert database, its end records), and each consumer used to read its own piece: alerting
applied rollbacks when an attempt settled, the engine rebuilt the run, the verdict counted
rollbacks, the status followed end records. Here those facts meet in one place that decides
what happened and says it as **events**, which the engine hands to each consumer
(``Engine._lifecycle``: the registry rebuilds the run, alerting applies and closes, the
store keeps the status, the verdict and the charts read what that left):

- ``AttemptSettled``: a new process's first step placed it (pipeline/attempts.py):
  ``first``, ``resumed`` from a checkpoint, or ``restarted`` (a new run reusing the id). A
  resume or restart makes an ended run running again.
- ``RollbackDecided`` / ``StopRequested``: the run's leader decided an action (a rule's
  ``action: rollback`` or ``stop``); the run now **awaits its resume** from the plan's
  checkpoint (in place, or by a relaunch) or **is stopping**.
- ``RolledBack``: an attempt settled at or before the pending plan's window: applied.
- ``Ended``: an end record; a ``stopped`` end honours the stop requested (or not: a run
  that ends ``completed`` with a stop pending never honoured it).

The phases: ``running`` -> ``awaiting_resume`` (a plan is pending) -> ``running`` (it was
applied) ...; ``running`` -> ``stopping`` -> ``ended``; any -> ``ended`` on an end record,
and ``ended`` -> ``running`` when a new attempt settles. ``describe()`` says the phase as
people read it.

What it holds is derived from durable state when a run loads (its attempts and status from
the store, its open actions from alerting), so a restart tells the same story.

A run that diverges, is told to roll back to its checkpoint at step 300, and resumes there::

    >>> from monitor_agent.storage.store import StoredAttempt
    >>> life = RunLifecycle(status="running")
    >>> [type(e).__name__ for e in life.acted([{"id": 1, "action": "rollback", "step": 345,
    ...     "plan": {"checkpoint_step": 300, "checkpoint_path": "/c/300.pt",
    ...              "skip_from": 301, "skip_to": 545}}])]
    ['RollbackDecided']
    >>> print(life.describe())
    awaiting resume from checkpoint step 300 (/c/300.pt), rollback 1 decided at step 345
    >>> resumed = StoredAttempt(2, "resumed", 301, 0.0, 301, 350)
    >>> [type(e).__name__ for e in life.settled(resumed)]
    ['AttemptSettled', 'RolledBack']
    >>> life.phase.value, life.describe()
    ('running', 'running')
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

from monitor_agent.storage.store import StoredAttempt


class Phase(enum.StrEnum):
    RUNNING = "running"
    AWAITING_RESUME = "awaiting_resume"  # a rollback plan is pending
    STOPPING = "stopping"                # a stop was requested, not yet honoured
    ENDED = "ended"                      # ``status`` says how


@dataclass(frozen=True, slots=True)
class AttemptSettled:
    attempt: StoredAttempt


@dataclass(frozen=True, slots=True)
class RollbackDecided:
    action_id: int
    checkpoint_step: int
    checkpoint_path: str
    skip_from: int
    decided_at_step: int


@dataclass(frozen=True, slots=True)
class RolledBack:
    action_id: int
    start_step: int


@dataclass(frozen=True, slots=True)
class StopRequested:
    action_id: int
    step: int


@dataclass(frozen=True, slots=True)
class Ended:
    status: str
    step: int
    stop_honoured: bool  # a stop was pending and the run ended ``stopped``


Event = AttemptSettled | RollbackDecided | RolledBack | StopRequested | Ended


class RunLifecycle:
    """One run's phase, pending rollback and open stop (see the module docstring)."""

    def __init__(self, status: str = "running") -> None:
        self.status = status
        self.rollback: RollbackDecided | None = None
        self.stop: StopRequested | None = None
        self._open: dict[int, dict[str, Any]] = {}  # id -> the action, as decided

    def open_actions(self) -> list[dict[str, Any]]:
        """The actions the run is to take and has not (a pending rollback, an open stop),
        as decided: every ingest answer of the run carries them, so each rank learns of
        them from its next answer whichever rank's finding decided them."""
        return list(self._open.values())

    @property
    def phase(self) -> Phase:
        if self.status != "running":
            return Phase.ENDED
        if self.rollback is not None:
            return Phase.AWAITING_RESUME
        if self.stop is not None:
            return Phase.STOPPING
        return Phase.RUNNING

    def settled(self, attempt: StoredAttempt) -> list[Event]:
        """An attempt's first step placed it (pipeline/attempts.py)."""
        events: list[Event] = [AttemptSettled(attempt)]
        if attempt.kind == "first":
            return events
        self.status = "running"  # a resume or restart: the run goes on, whatever ended it
        pending, start = self.rollback, attempt.start_step
        if pending is not None and start is not None and start <= pending.skip_from:
            events.append(RolledBack(pending.action_id, start))
            self.rollback = None
            self._open.pop(pending.action_id, None)
        if self.stop is not None:  # the stopped process is gone; a new one's stop comes anew
            self._open.pop(self.stop.action_id, None)
        self.stop = None
        return events

    def acted(self, actions: list[dict[str, Any]]) -> list[Event]:
        """Actions the run's leader decided (here, or adopted from it)."""
        events: list[Event] = []
        for a in actions:
            if a.get("honoured_step") is not None or not isinstance(a.get("id"), int):
                continue  # history, not an order
            kind, plan = a.get("action"), a.get("plan")
            if kind in ("rollback", "stop"):
                self._open[int(a["id"])] = dict(a)
            if kind == "rollback" and isinstance(plan, dict):
                self.rollback = RollbackDecided(
                    int(a["id"]), int(plan["checkpoint_step"]), str(plan["checkpoint_path"]),
                    int(plan["skip_from"]), int(a.get("step") or 0))
                events.append(self.rollback)
            elif kind == "stop" and self.stop is None:
                self.stop = StopRequested(int(a["id"]), int(a.get("step") or 0))
                events.append(self.stop)
        return events

    def ended(self, status: str, step: int) -> list[Event]:
        """An end record (``status``: completed, failed or stopped)."""
        honoured = self.stop is not None and status == "stopped"
        self.status = status
        if honoured and self.stop is not None:
            self._open.pop(self.stop.action_id, None)
            self.stop = None
        return [Ended(status, step, honoured)]

    def describe(self) -> str:
        """The phase as people read it."""
        phase = self.phase
        if phase is Phase.AWAITING_RESUME and self.rollback is not None:
            r = self.rollback
            return (f"awaiting resume from checkpoint step {r.checkpoint_step} "
                    f"({r.checkpoint_path}), rollback {r.action_id} decided at step "
                    f"{r.decided_at_step}")
        if phase is Phase.STOPPING and self.stop is not None:
            return f"stopping: stop {self.stop.action_id} requested at step {self.stop.step}"
        return "running" if phase is Phase.RUNNING else self.status
