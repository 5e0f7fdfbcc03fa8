"""The rollback plan a rule's ``action: rollback`` sends (docs/alerting.md), and one decision
for every rank.

The run's leader sidecar decides once per run and every rank's sidecar serves the identical
action; this module turns it into a frozen ``RollbackPlan`` and, through ``_agreement.py``,
makes every rank of a distributed job act on it at the same call, or none (a rank that
lacks the plan, or holds another one under the same id, holds the whole job back and its
sidecar pages that). Every rank calls ``Monitor.rollback_plan()`` once per optimizer step;
the plan is handed out only at every ``check_every``-th call. At the default of 10 a
rollback starts at most 10 steps after its plan reached the first rank, against the
hundreds of steps a rollback replays anyway.

A plan, and the helpers a loop needs to apply it::

    >>> plan = RollbackPlan.from_action({"id": 3, "action": "rollback", "rule": "RollBack",
    ...     "step": 140, "message": "rolled back to step 100 (ckpt/100.pt), skipping batches "
    ...     "101-150; LR x0.5 for 20 steps", "plan": {"checkpoint_step": 100,
    ...     "checkpoint_path": "ckpt/100.pt", "skip_from": 101, "skip_to": 150,
    ...     "lr_factor": 0.5, "lr_steps": 20, "number": 1, "budget": 2}})
    >>> plan.resume_step, plan.skip_batches
    (101, 50)
    >>> [plan.lr_multiplier(s) for s in (100, 101, 120, 121)]
    [1.0, 0.5, 0.5, 1.0]
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_client._agreement import Consensus, content_digest, distributed, newest, unanimous

__all__ = ["CHECKPOINT_PATH_MAX", "CHECKPOINT_TAG_MAX", "FETCH_TIMEOUT", "RESUME_FILE",
           "PlanBook", "RollbackPlan", "barrier", "read_resume_file", "write_resume_file"]

Held = Callable[[Consensus, int, "RollbackPlan | None"], None]
"""Told each time an agreed call held a plan back: (why, how many calls in a row, this
rank's copy or None)."""

# The sidecar's caps on a ``checkpoint`` record (monitor_agent/records/limits.py): a path the
# sidecar would refuse is refused here, with the reason, instead of dying in the spool.
CHECKPOINT_PATH_MAX = 4096
CHECKPOINT_TAG_MAX = 200

# How long ``rolled_back`` waits for the records of the abandoned branch to reach the
# sidecar before the ranks meet at the barrier.
FETCH_TIMEOUT = 10.0
# Where the HF and Lightning callbacks leave a plan for the launcher that relaunches the run.
RESUME_FILE = "monitor_rollback.json"


@dataclass(frozen=True)
class RollbackPlan:
    """One rollback decision (the contract's ``plan`` fields plus the action's id, rule,
    message and fault ``step``), identical on every rank.

    Applying it: reload model, optimizer, scheduler and RNG state from ``checkpoint_path``
    (the state after optimizer step ``checkpoint_step``); the loop's next step is
    ``resume_step``; fast-forward the data by ``skip_batches`` batches past where the
    checkpoint left it, so the batches of steps ``skip_from``..``skip_to`` are never trained
    on; multiply the LR by ``lr_multiplier(step)``; then ``Monitor.rolled_back(plan)``.
    """

    id: int
    rule: str
    message: str
    step: int
    checkpoint_step: int
    checkpoint_path: str
    skip_from: int
    skip_to: int
    lr_factor: float | None
    lr_steps: int | None
    number: int
    budget: int
    # What every rank's copy is compared by before any acts (_agreement.py).
    digest: int = field(default=0, compare=False)

    @classmethod
    def from_action(cls, action: dict[str, Any]) -> RollbackPlan | None:
        """The plan of a ``rollback`` action dict; None for any other action or one
        whose plan is malformed (a plan with holes must not half-apply)."""
        plan = action.get("plan")
        if action.get("action") != "rollback" or not isinstance(plan, dict):
            return None
        try:
            factor, steps = plan.get("lr_factor"), plan.get("lr_steps")
            made = cls(id=int(action["id"]), rule=str(action.get("rule") or ""),
                       message=str(action.get("message") or ""),
                       step=int(action.get("step") or plan["skip_to"]),
                       checkpoint_step=int(plan["checkpoint_step"]),
                       checkpoint_path=str(plan["checkpoint_path"]),
                       skip_from=int(plan["skip_from"]), skip_to=int(plan["skip_to"]),
                       lr_factor=None if factor is None else float(factor),
                       lr_steps=None if steps is None else int(steps),
                       number=int(plan.get("number") or 1), budget=int(plan.get("budget") or 1),
                       digest=content_digest(action))
        except (KeyError, TypeError, ValueError):
            return None
        return made if made.skip_to >= made.checkpoint_step else None

    @property
    def resume_step(self) -> int:
        """The loop's next optimizer step after reloading the checkpoint."""
        return self.checkpoint_step + 1

    @property
    def skip_batches(self) -> int:
        """Batches to fast-forward the loader by, from where the checkpoint left it."""
        return self.skip_to - self.checkpoint_step

    def lr_multiplier(self, step: int) -> float:
        """``lr_factor`` for the ``lr_steps`` steps from ``resume_step`` on, else 1.0: scale
        whatever the schedule gives (``lr = schedule(step) * plan.lr_multiplier(step)``), so
        the schedule itself is untouched and the factor ends on its own."""
        if self.lr_factor is None or not self.lr_steps:
            return 1.0
        inside = self.resume_step <= step < self.resume_step + self.lr_steps
        return self.lr_factor if inside else 1.0

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (what the framework callbacks write for the launcher)."""
        return dataclasses.asdict(self)


class PlanBook:
    """The rollback plans a process has received, which it applied, and the agreement.

    ``receive`` runs on the sender thread (an ``ActionInbox`` callback), ``pending`` and
    ``applied`` on the training thread. A plan the sidecar already saw honoured (a resumed
    attempt settled: ``honoured_step`` set) is history, not an order: a relaunched process
    that reads it back from the actions endpoint must not roll back again.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plans: dict[int, RollbackPlan] = {}
        self._done: set[int] = set()
        self._calls = 0
        self._held: dict[int, int] = {}  # plan id -> agreed calls in a row it was held back

    def receive(self, action: dict[str, Any]) -> None:
        plan = RollbackPlan.from_action(action)
        if plan is None:
            return
        with self._lock:
            if action.get("honoured_step") is not None:
                self._done.add(plan.id)
            self._plans.setdefault(plan.id, plan)

    def applied(self, plan_id: int) -> None:
        with self._lock:
            self._done.add(int(plan_id))

    def newest(self) -> RollbackPlan | None:
        """The newest plan received and not applied (an older one it supersedes is moot)."""
        with self._lock:
            ids = [i for i in self._plans if i not in self._done]
            return self._plans[max(ids)] if ids else None

    def get(self, plan_id: int) -> RollbackPlan | None:
        with self._lock:
            return self._plans.get(plan_id)

    def agreed(self, check_every: int, fetch: Callable[[int], None],
               held: Held | None = None) -> RollbackPlan | None:
        """The plan every rank acts on now, or None (see ``_agreement.py``).

        Single process: the newest pending plan, at once. Distributed: decided only at every
        ``check_every``-th call; ``fetch(plan_id)`` asks the sidecar once for a plan this
        rank has not received (it lands here through ``receive``); ``held`` hears why a
        plan every rank should act on was held back.
        """
        dist = distributed()
        if dist is None:
            return self.newest()
        self._calls += 1
        if self._calls % check_every:
            return None
        top = self.newest()
        agreed = newest(dist, top.id if top else 0)
        if agreed == 0:
            return None
        if self.get(agreed) is None:
            fetch(agreed)
        plan = self.get(agreed)
        with self._lock:  # another rank's newer plan wins even if this one saw it applied
            usable = plan is not None and agreed not in self._done
        verdict = unanimous(dist, agreed, plan.digest if usable and plan is not None else None)
        if verdict.act:
            self._held.pop(agreed, None)
            return plan
        self._held[agreed] = rounds = self._held.get(agreed, 0) + 1
        if held is not None and (not usable or verdict.why == "mismatch"):
            held(verdict, rounds, plan if usable else None)
        return None


def barrier(then: Callable[[int], None], plan_id: int) -> None:
    """Meet every rank (when distributed), then ``then(plan_id)``."""
    dist = distributed()
    if dist is not None:
        dist.barrier()
    then(plan_id)


def write_resume_file(directory: str | os.PathLike[str], plan: RollbackPlan,
                      **extra: Any) -> str:
    """Write ``plan`` (and ``extra``, e.g. the framework's resume argument) as
    ``<directory>/monitor_rollback.json`` for the launcher; atomic, so a launcher never reads
    half a plan. Returns the file's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(os.fspath(directory), RESUME_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as out:
        json.dump({**plan.as_dict(), **extra}, out, indent=1)
    os.replace(path + ".tmp", path)
    return path


def read_resume_file(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The plan a previous process left in ``directory``, or None (absent or unreadable)."""
    try:
        with open(os.path.join(os.fspath(directory), RESUME_FILE), encoding="utf-8") as src:
            found = json.load(src)
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) and isinstance(found.get("id"), int) else None
