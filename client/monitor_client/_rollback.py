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

A plan names data positions (README, "Closing the loop"): the data resumes after
``resume_position`` and never trains a position inside one of the ``skip`` windows, every
earlier rollback's included. A second rollback to the checkpoint of step 100 (position
100), after a first one skipped batches 101-130::

    >>> plan = RollbackPlan.from_action({"id": 3, "action": "rollback", "rule": "RollBack",
    ...     "step": 140, "message": "rolled back to step 100 (ckpt/100.pt, data position 100), "
    ...     "skipping batches 101-190; LR x0.5 for 20 steps", "plan": {"checkpoint_step": 100,
    ...     "checkpoint_path": "ckpt/100.pt", "resume_position": 100, "skip": [[101, 190]],
    ...     "positions": "positions", "skip_from": 101, "skip_to": 150,
    ...     "lr_factor": 0.5, "lr_steps": 20, "number": 2, "budget": 2}})
    >>> plan.resume_step, plan.resume_position, plan.skip, plan.skips(150), plan.skips(191)
    (101, 100, ((101, 190),), True, False)
    >>> [plan.lr_multiplier(s) for s in (100, 101, 120, 121)]
    [1.0, 0.5, 0.5, 1.0]
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from monitor_client._agreement import Consensus, content_digest, distributed, newest, unanimous
from monitor_client._plain_file import read_json

__all__ = ["CHAIN_MAX", "CHECKPOINT_PATH_MAX", "CHECKPOINT_TAG_MAX", "FETCH_TIMEOUT", "RESUME_FILE",
           "PlanBook", "RollbackPlan", "barrier", "read_resume_file", "write_resume_file"]

Held = Callable[[Consensus, int, "RollbackPlan | None"], None]
"""Told each time an agreed call held a plan back: (why, how many calls in a row, this
rank's copy or None)."""

# The sidecar's caps on a ``checkpoint`` record (monitor_agent/records/limits.py): a path the
# sidecar would refuse is refused here, with the reason, instead of dying in the spool.
CHECKPOINT_PATH_MAX = 4096
CHECKPOINT_TAG_MAX = 200

# How many of the job's checkpoints a process hands on to the next one (``PlanBook.chain``):
# the newest, by step. A rollback goes to the last clean checkpoint before a fault's onset,
# one of the newest few saves; 256 of them, at the 4096-character path limit, stay within
# the 4 MiB a plan file may hold (_plain_file.py).
CHAIN_MAX = 256
# How long ``rolled_back`` waits for the records of the abandoned branch to reach the
# sidecar before the ranks meet at the barrier.
FETCH_TIMEOUT = 10.0
# Where the HF and Lightning callbacks leave a plan for the launcher that relaunches the run.
RESUME_FILE = "monitor_rollback.json"
# The bounds of a plan (``RollbackPlan.problem``): what the sidecar's rules can decide.
MAX_COUNT = 2**53
MAX_WINDOWS = 10_000
MAX_LR_STEPS = 10_000_000
MAX_SKIPPED = 2**40  # no run's data stream holds this many batches or samples (1.1e12)


@dataclass(frozen=True)
class RollbackPlan:
    """One rollback decision (the contract's ``plan`` fields plus the action's id, rule,
    message and fault ``step``), identical on every rank.

    Applying it: reload model, optimizer, scheduler and RNG state from ``checkpoint_path``
    (the state after optimizer step ``checkpoint_step``); the loop's next step is
    ``resume_step``; resume the data after the position the checkpoint saved (the sidecar's
    copy of it: ``resume_position``) and leave out every position ``skips()`` names
    (``DataStream.seek(position, skip=plan.skip)`` does both); multiply the LR by
    ``lr_multiplier(step)``; then ``Monitor.rolled_back(plan)``. ``skip_from``/``skip_to``
    are the fault's window in steps (what the sidecar applies the plan by).
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
    # The data: where it resumes, the windows it never trains (inclusive, positions), and
    # what they count ("positions"; "steps" when the run reported no data position).
    resume_position: int = 0
    skip: tuple[tuple[int, int], ...] = ()
    positions: str = "steps"
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
            skip = plan.get("skip")
            windows = (tuple((_count(w[0]), _count(w[1])) for w in skip)
                       if isinstance(skip, list)
                       else ((_count(plan["skip_from"]), _count(plan["skip_to"])),))
            resume = plan.get("resume_position")
            made = cls(id=_count(action["id"]), rule=str(action.get("rule") or ""),
                       message=str(action.get("message") or ""),
                       step=_count(action.get("step") or plan["skip_to"]),
                       checkpoint_step=_count(plan["checkpoint_step"]),
                       checkpoint_path=str(plan["checkpoint_path"]),
                       skip_from=_count(plan["skip_from"]), skip_to=_count(plan["skip_to"]),
                       lr_factor=None if factor is None else _number(factor),
                       lr_steps=None if steps is None else _count(steps),
                       number=_count(plan.get("number") or 1),
                       budget=_count(plan.get("budget") or 1),
                       resume_position=_count(resume if resume is not None
                                              else plan["checkpoint_step"]),
                       skip=windows, positions=str(plan.get("positions") or "steps"),
                       digest=content_digest(action))
        except (KeyError, TypeError, ValueError, OverflowError):
            return None
        return made if made.problem() is None else None

    @property
    def resume_step(self) -> int:
        """The loop's next optimizer step after reloading the checkpoint."""
        return self.checkpoint_step + 1

    @property
    def skip_batches(self) -> int:
        """Positions to fast-forward by from ``resume_position`` to the next one the plan
        keeps: right for a loop that counts its data in one run of positions, as long as
        no window lies further ahead. ``DataStream.seek(position, skip=plan.skip)`` is
        right in every case; prefer it."""
        position = self.resume_position + 1
        while self.skips(position):
            position = next(b for a, b in self.skip if a <= position <= b) + 1
        return position - 1 - self.resume_position

    def skips(self, position: int) -> bool:
        """Whether the data at ``position`` is one the plan never trains."""
        return any(a <= position <= b for a, b in self.skip)

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
        out = dataclasses.asdict(self)
        out["skip"] = [list(w) for w in self.skip]
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RollbackPlan | None:
        """A plan back from ``as_dict`` (the resume file); None when it is not one."""
        try:
            fields = {f.name for f in dataclasses.fields(cls)}
            made = cls(**{k: v for k, v in data.items() if k in fields})
            made = dataclasses.replace(made, skip=tuple((int(a), int(b)) for a, b in made.skip))
        except (TypeError, ValueError, OverflowError):
            return None
        return made if made.problem() is None else None

    def problem(self) -> str | None:
        """Why this is not a plan any sidecar decides, or None: every count a JSON integer
        in range (steps and positions 0..2**53, windows first <= last, at most
        ``MAX_WINDOWS`` of them skipping at most ``MAX_SKIPPED`` positions in all), the
        checkpoint before the window, ``lr_factor`` None or a finite
        number in (0, 1] with ``lr_steps`` 1..``MAX_LR_STEPS`` (the sidecar's rules allow no
        other: monitor_agent/alerting/rules.py). A plan that breaks one is dropped whole:
        applied, NaN or 1e308 would make the LR nan or absurd, and a window of 10**15
        positions would skip the rest of the data.

            >>> base = {"id": 1, "action": "rollback", "plan": {"checkpoint_step": 10,
            ...         "checkpoint_path": "c", "skip_from": 11, "skip_to": 20}}
            >>> [RollbackPlan.from_action({**base, "plan": {**base["plan"], "lr_factor": f,
            ...      "lr_steps": 5}}) is None for f in (0.5, float("nan"), -1, 1e308, "abc")]
            [False, True, True, True, True]
            >>> RollbackPlan.from_action({**base, "plan": {**base["plan"],
            ...                                            "skip": [[101, 10**15]]}}) is None
            True
        """
        ints = (self.id, self.step, self.checkpoint_step, self.skip_from, self.skip_to,
                self.number, self.budget, self.resume_position,
                *(x for w in self.skip for x in w))
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= MAX_COUNT
                   for x in ints):
            return "a step, position or count is not an integer in 0..2**53"
        if not self.checkpoint_step < self.skip_from <= self.skip_to:
            return "the window is not after the checkpoint"
        if len(self.skip) > MAX_WINDOWS or any(a > b for a, b in self.skip):
            return "the windows are not [first, last] pairs"
        if sum(b - a + 1 for a, b in self.skip) > MAX_SKIPPED:
            return f"the windows skip more than {MAX_SKIPPED} positions"
        if self.lr_factor is None:  # no LR change (lr_steps, if any, says nothing)
            return None
        factor, steps = self.lr_factor, self.lr_steps
        if isinstance(factor, bool) or not isinstance(factor, int | float) or \
                not math.isfinite(factor) or not 0 < factor <= 1:
            return "lr_factor is not a finite number in (0, 1]"
        if isinstance(steps, bool) or not isinstance(steps, int) or \
                not 1 <= steps <= MAX_LR_STEPS:
            return f"lr_steps is not an integer in 1..{MAX_LR_STEPS}"
        return None


def _count(value: Any) -> int:
    """A plan's integer as JSON carries it: not a string, not a bool, not a float."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"not an integer: {value!r:.40}")
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"not a number: {value!r:.40}")
    return float(value)


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
        # (step, path) of every checkpoint this process reported (``checkpoint_saved``),
        # resumed from (``resumed_from``), or inherited from the job's process before it
        # (``inherit``: a plan file's or a checkpoint's record of the job's saves): the
        # only ones a plan may send it back to.
        self._vouched: set[tuple[int, str]] = set()

    def vouch(self, step: int, path: str) -> None:
        with self._lock:
            self._vouched.add((int(step), str(path)))

    def chain(self) -> list[list[Any]]:
        """The job's checkpoints this process vouches for, ``[step, path]``, oldest first
        (the newest ``CHAIN_MAX``): what the next process of the job inherits (a plan file,
        a checkpoint's own record of the saves before it)."""
        with self._lock:
            return [[s, p] for s, p in sorted(self._vouched)[-CHAIN_MAX:]]

    def inherit(self, chain: Any) -> int:
        """Vouch for the checkpoints of ``chain`` (what ``chain()`` gave an earlier process
        of the job); entries that are not ``[step, path]`` are ignored. How many taken."""
        taken = 0
        for entry in chain[-CHAIN_MAX:] if isinstance(chain, list) else ():
            if (isinstance(entry, list | tuple) and len(entry) == 2
                    and isinstance(entry[0], int) and not isinstance(entry[0], bool)
                    and isinstance(entry[1], str)
                    and 0 < len(entry[1]) <= CHECKPOINT_PATH_MAX):
                self.vouch(entry[0], entry[1])
                taken += 1
        return taken

    def vouches(self, plan: RollbackPlan) -> bool:
        """Whether this process saved (or resumed from) the checkpoint ``plan`` names."""
        with self._lock:
            return (plan.checkpoint_step, plan.checkpoint_path) in self._vouched

    def receive(self, action: dict[str, Any]) -> None:
        plan = RollbackPlan.from_action(action)
        if plan is None:
            return
        with self._lock:
            if action.get("honoured_step") is not None or \
                    action.get("withdrawn_by") is not None:
                self._done.add(plan.id)  # applied, or replaced before it was: no order
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
        plan every rank should act on was held back. Either way a plan is handed out only
        when this process (distributed: some rank of the job) vouches for the checkpoint it
        names (``vouch``, ``inherit``): one the sidecar's ledger got from anywhere else is
        refused (``unreported``; the Monitor then stops the run).
        """
        dist = distributed()
        if dist is None:
            top = self.newest()
            if top is None or self.vouches(top):
                return top
            self._held[top.id] = rounds = self._held.get(top.id, 0) + 1
            if held is not None:
                held(Consensus(False, top.id, "unreported"), rounds, top)
            return None
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
        known = usable and plan is not None and self.vouches(plan)
        verdict = unanimous(dist, agreed, plan.digest if usable and plan is not None else None,
                            known)
        if verdict.act:
            self._held.pop(agreed, None)
            return plan
        self._held[agreed] = rounds = self._held.get(agreed, 0) + 1
        if held is not None and (not usable or verdict.why in ("mismatch", "unreported")):
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


def read_resume_file(directory: str | os.PathLike[str], name: str = RESUME_FILE,
                     refused: Callable[[str], None] | None = None) -> dict[str, Any] | None:
    """The plan a previous process left in ``directory`` (as ``name``), or None: absent,
    not JSON, not a plan, or not a regular file of bounded size (_plain_file.py: a symlink
    or a FIFO planted there is neither followed nor waited on), which ``refused`` hears."""
    path = os.path.join(os.fspath(directory), name)
    try:
        found = read_json(path)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        if refused is not None:
            refused(f"{path}: {exc}")
        return None
    return found if isinstance(found, dict) and isinstance(found.get("id"), int) else None
