"""A run's lifecycle: one state machine from its first record to its end, across attempts,
rollbacks and stops.

A run id's story is told by several parts (its attempts in the store, the actions in the
alert database, its end records), and each consumer used to read its own piece: alerting
applied rollbacks when an attempt settled, the engine rebuilt the run, the verdict counted
rollbacks, the status followed end records. Here those facts meet in one place that decides
what happened and says it as **events**, which the engine hands to each consumer
(``Consequences.events``: the registry rebuilds the run, alerting applies and closes, the
store keeps the status, the verdict and the charts read what that left):

- ``AttemptSettled``: a new process's first step placed it (pipeline/attempts.py):
  ``first``, ``resumed`` from a checkpoint, or ``restarted`` (a new run reusing the id). A
  resume or restart makes an ended run running again.
- ``RollbackDecided`` / ``StopRequested``: the run's leader decided an action (a rule's
  ``action: rollback`` or ``stop``); the run now **awaits its resume** from the plan's
  checkpoint (in place, or by a relaunch) or **is stopping**.
- ``RestartDecided``: a rule's ``action: restart`` (or ``exclude``): every rank leaves and
  the job's launcher runs it again; the run is **restarting** until a new attempt settles
  (``Restarted``: carried out), which its silence meanwhile does not change.
- ``RolledBack``: an attempt settled at or before the pending plan's window: applied. The
  newest applied plan (``applied``) is what the resumed run's data positions are checked
  against (its ``skip`` holds every earlier window too), until a restart replaces the run.
- ``Ended``: an end record; a ``stopped`` end honours the stop requested (or not: a run
  that ends ``completed`` with a stop pending never honoured it, and ``stop_ignored`` says
  so). A run that ends with a rollback pending (a framework's callback stopped it for a
  relaunch) is **waiting for its relaunch** until the new attempt arrives.

The phases: ``running`` -> ``awaiting_resume`` (a plan is pending) -> ``running`` (it was
applied) ...; ``awaiting_resume`` -> ``awaiting_relaunch`` when the process ends with the
plan pending; ``running`` -> ``stopping`` -> ``ended``; any -> ``ended`` on an end record,
and ``ended`` -> ``running`` when a new attempt settles. A running run that nothing is
heard from for longer than its stall limit, with no end record, is ``silent`` (``Silent``:
its process most likely died, as a SIGTERM or SIGKILL leaves it) until its next record.
A resumed attempt that applied no
plan is said as what it was (``resume_kind``): a resume after a crash (the process before
it sent no end record, or ended ``failed``), or from a checkpoint after a clean end.
``describe()`` says the phase as people read it.

What it holds is derived from durable state when a run loads (its attempts and status from
the store, its actions from alerting: the open ones and the applied rollbacks), so a
restart tells the same story.

A run that diverges, is told to roll back to its checkpoint at step 300, and resumes there::

    >>> from monitor_agent.storage.store import StoredAttempt
    >>> life = RunLifecycle(status="running")
    >>> plan = RollbackSpec(checkpoint_step=300, checkpoint_path="/c/300.pt", skip_from=301,
    ...                     skip_to=545, skip=((301, 545),))
    >>> rollback = Action(1, "r", "rollback", "R", "divergence", step=345, message="",
    ...                   created_at=0.0, plan=plan)
    >>> [type(e).__name__ for e in life.acted([rollback])]
    ['RollbackDecided']
    >>> print(life.describe())
    awaiting resume from checkpoint step 300 (/c/300.pt), rollback 1 decided at step 345
    >>> resumed = StoredAttempt(2, "resumed", 301, 0.0, 301, 350)
    >>> [type(e).__name__ for e in life.settled(resumed)]
    ['AttemptSettled', 'RolledBack']
    >>> life.phase.value, life.describe(), life.applied.skip
    ('running', 'running', ((301, 545),))

The same run under a framework whose callback stops the process to be relaunched::

    >>> life = RunLifecycle(status="running")
    >>> from dataclasses import replace
    >>> _ = life.acted([replace(rollback, plan=replace(plan,
    ...                                                checkpoint_path="/c/checkpoint-300"))])
    >>> _ = life.ended("stopped", 346)
    >>> print(life.describe())
    waiting for relaunch from checkpoint step 300 (/c/checkpoint-300): rollback 1 decided at step 345
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from monitor_agent.records.actions import RESTART_ACTIONS, Action, RollbackSpec
from monitor_agent.storage.store import StoredAttempt


class Phase(enum.StrEnum):
    RUNNING = "running"
    SILENT = "silent"                    # running, but nothing heard for a stall: likely dead
    AWAITING_RESUME = "awaiting_resume"  # a rollback plan is pending
    AWAITING_RELAUNCH = "awaiting_relaunch"  # the process ended with a plan pending
    RESTARTING = "restarting"            # a restart was decided; the launcher relaunches
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
    # The plan's data windows (alerting/rollback.py ``skip``), where the data resumes, and
    # what they count ("positions", or "steps" for a run without data positions).
    skip: tuple[tuple[int, int], ...] = ()
    resume_position: int | None = None
    unit: str = "steps"


@dataclass(frozen=True, slots=True)
class RolledBack:
    action_id: int
    start_step: int
    # The plan applied (its windows, where the data resumed, their unit).
    skip: tuple[tuple[int, int], ...] = ()
    resume_position: int | None = None
    unit: str = "steps"


@dataclass(frozen=True, slots=True)
class RestartDecided:
    action_id: int
    decided_at_step: int
    said: str  # the plan as pages say it (records/restart_plan.py ``RestartPlan.describe``)
    decided_at: float = 0.0  # when (the leader's clock): an attempt begun after carries it out


@dataclass(frozen=True, slots=True)
class Restarted:
    action_id: int
    start_step: int


@dataclass(frozen=True, slots=True)
class StopRequested:
    action_id: int
    step: int


@dataclass(frozen=True, slots=True)
class Silent:
    """Nothing from any rank of a running run for longer than its stall limit, and no end
    record: its process most likely died (killed by SIGKILL/SIGTERM, or crashed without a
    word); ``gone``: the ranks' watchdogs would have reported a hang, and did not."""

    step: int
    limit_seconds: float
    gone: bool = False


@dataclass(frozen=True, slots=True)
class Ended:
    status: str
    step: int
    stop_honoured: bool  # a stop was pending and the run ended ``stopped``
    # A stop was pending and the run ended otherwise (``completed``: it never honoured it).
    stop_ignored: bool = False


Event = (AttemptSettled | RollbackDecided | RolledBack | RestartDecided | Restarted
         | StopRequested | Silent | Ended)


class RunLifecycle:
    """One run's phase, pending rollback and open stop (see the module docstring)."""

    def __init__(self, status: str = "running") -> None:
        self.status = status
        self.rollback: RollbackDecided | None = None
        self.stop: StopRequested | None = None
        self.restart: RestartDecided | None = None
        self.applied: RolledBack | None = None  # the newest rollback applied
        # Start step -> action id of every rollback applied: which resumed attempts were
        # rollbacks, and which were resumes after a crash or a clean end.
        self.applied_starts: dict[int, int] = {}
        self._open: dict[int, Action] = {}  # id -> the action, as decided
        self.silent: Silent | None = None  # until the next record (not durable: re-judged)

    def open_actions(self) -> list[Action]:
        """The actions the run is to take and has not (a pending rollback, an open stop),
        as decided: every ingest answer of the run carries them, so each rank learns of
        them from its next answer whichever rank's finding decided them."""
        return list(self._open.values())

    @property
    def phase(self) -> Phase:
        if self.status != "running":
            return Phase.AWAITING_RELAUNCH if self.rollback is not None else Phase.ENDED
        if self.restart is not None:  # its ranks left on purpose: silence is expected
            return Phase.RESTARTING
        if self.silent is not None:
            return Phase.SILENT
        if self.rollback is not None:
            return Phase.AWAITING_RESUME
        if self.stop is not None:
            return Phase.STOPPING
        return Phase.RUNNING

    @property
    def expects_new_attempt(self) -> bool:
        """Whether a new attempt may replace the run's current one now without waiting for
        it to go quiet (pipeline/attempts.py ``holds_history``): the run ended, went
        silent, or an action asks its processes to go (a rollback pending: they resume or
        are relaunched; a stop)."""
        return self.phase is not Phase.RUNNING

    def settled(self, attempt: StoredAttempt) -> list[Event]:
        """An attempt's first step placed it (pipeline/attempts.py)."""
        events: list[Event] = [AttemptSettled(attempt)]
        if attempt.kind == "first":
            return events
        self.status = "running"  # a resume or restart: the run goes on, whatever ended it
        if attempt.kind == "restarted":  # a new run reusing the id: earlier windows are moot
            self.applied, self.applied_starts = None, {}
        pending, start = self.rollback, attempt.start_step
        if pending is not None and start is not None and start <= pending.skip_from:
            self.applied = RolledBack(pending.action_id, start, pending.skip,
                                      pending.resume_position, pending.unit)
            self.applied_starts[start] = pending.action_id
            events.append(self.applied)
            self.rollback = None
            self._open.pop(pending.action_id, None)
        if self.restart is not None and attempt.started_at >= self.restart.decided_at:
            # The job came back: the restart was carried out (an attempt begun before it
            # was decided is a relaunch of the launcher's own, and it still waits).
            events.append(Restarted(self.restart.action_id, start or 0))
            self._open.pop(self.restart.action_id, None)
            self.restart = None
        if self.stop is not None:  # the stopped process is gone; a new one's stop comes anew
            self._open.pop(self.stop.action_id, None)
        self.stop = None
        return events

    def acted(self, actions: list[Action]) -> list[Event]:
        """Actions the run's leader decided (here, or adopted from it)."""
        events: list[Event] = []
        for a in actions:
            if a.rollback is not None and a.honoured_step is not None:
                self._history(a.id, a.honoured_step, a.rollback)  # applied: history
                continue
            if a.honoured_step is not None:
                continue  # history, not an order
            if a.withdrawn_by is not None:  # replaced before it was applied
                self.withdrawn(a.id)
                continue
            if a.action in ("rollback", "stop", *RESTART_ACTIONS):
                self._open[a.id] = a
            if a.rollback is not None:
                plan = a.rollback
                self.rollback = RollbackDecided(
                    a.id, plan.checkpoint_step, plan.checkpoint_path, plan.skip_from, a.step,
                    plan.skip, plan.resume_position, plan.positions)
                events.append(self.rollback)
            elif a.action == "stop" and self.stop is None:
                self.stop = StopRequested(a.id, a.step)
                events.append(self.stop)
            elif a.action in RESTART_ACTIONS:
                said = a.restart.describe() if a.restart is not None else a.message
                self.restart = RestartDecided(a.id, a.step, said, a.created_at)
                events.append(self.restart)
        return events

    def withdrawn(self, action_id: int) -> None:
        """The pending rollback ``action_id`` was withdrawn before it was applied (its
        checkpoint turned suspect, alerting/episodes.py ``revise``, or the job refused it,
        ``refused``): no longer an order."""
        self._open.pop(action_id, None)
        if self.rollback is not None and self.rollback.action_id == action_id:
            self.rollback = None

    def _history(self, action_id: int, start: int, plan: RollbackSpec) -> None:
        """A rollback applied before this lifecycle was made (the run loaded again)."""
        self.applied_starts[start] = action_id
        if self.applied is None or action_id > self.applied.action_id:
            self.applied = RolledBack(action_id, start, plan.skip, plan.resume_position,
                                      plan.positions)

    def went_silent(self, step: int, limit_seconds: float, gone: bool = False) -> list[Event]:
        """Nothing heard from any rank for ``limit_seconds`` after step ``step`` (the stall
        or hang detectors' judgement, ``Clock._tick_run``, pipeline/clock.py)."""
        if self.status != "running" or (self.silent is not None and self.silent.gone >= gone):
            return []
        self.silent = Silent(step, limit_seconds, gone)
        return [self.silent]

    def heard(self) -> None:
        """A record arrived: the run is not silent (any more)."""
        self.silent = None

    def ended(self, status: str, step: int) -> list[Event]:
        """An end record (``status``: completed, failed or stopped)."""
        self.silent = None
        honoured = self.stop is not None and status == "stopped"
        ignored = self.stop is not None and status == "completed"
        self.status = status
        if (honoured or ignored) and self.stop is not None:
            self._open.pop(self.stop.action_id, None)
            self.stop = None
        return [Ended(status, step, honoured, ignored)]

    def resume_kind(self, attempt: StoredAttempt, before_ended: str | None) -> str:
        """What a resumed attempt was: ``rollback`` (it applied a plan), ``crash`` (the
        process before it ended ``failed`` or sent no end record: killed) or ``resume``
        (from a checkpoint after a clean end)."""
        if attempt.start_step is not None and attempt.start_step in self.applied_starts:
            return "rollback"
        return "crash" if before_ended in (None, "failed") else "resume"

    def describe(self) -> str:
        """The phase as people read it."""
        phase = self.phase
        if phase is Phase.RESTARTING and self.restart is not None:
            return (f"restarting: {self.restart.said}; restart {self.restart.action_id} "
                    f"decided at step {self.restart.decided_at_step}")
        if phase is Phase.AWAITING_RESUME and self.rollback is not None:
            r = self.rollback
            return (f"awaiting resume from checkpoint step {r.checkpoint_step} "
                    f"({r.checkpoint_path}), rollback {r.action_id} decided at step "
                    f"{r.decided_at_step}")
        if phase is Phase.AWAITING_RELAUNCH and self.rollback is not None:
            r = self.rollback
            return (f"waiting for relaunch from checkpoint step {r.checkpoint_step} "
                    f"({r.checkpoint_path}): rollback {r.action_id} decided at step "
                    f"{r.decided_at_step}")
        if phase is Phase.SILENT and self.silent is not None:
            s = self.silent
            limit = f"{s.limit_seconds / 60:.0f} min" if s.limit_seconds >= 120 else \
                f"{s.limit_seconds:.0f} s"
            why = ("its ranks' watchdogs did not report a hang: the process is gone" if s.gone
                   else "its process most likely died (killed, or crashed without a word)")
            return f"silent since step {s.step}: nothing for over {limit}, no end record; {why}"
        if phase is Phase.STOPPING and self.stop is not None:
            return f"stopping: stop {self.stop.action_id} requested at step {self.stop.step}"
        return "running" if phase is Phase.RUNNING else self.status
