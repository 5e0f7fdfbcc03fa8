"""The run's control plane: what the sidecar asks the trainer to do, and one answer on every rank.

``Monitor`` reports the run; this ``Control`` is the other direction. Alert rules act on the
run (docs/actions.md): ``stop``, ``checkpoint``, ``rollback``, a restart. Their actions reach
the process in ingest answers and polls (the sender thread, into the ``ActionInbox`` of
``_actions.py``), and the training loop reads them through the Monitor's
``should_stop()``, ``should_checkpoint()``, ``rollback_plan()``, ``resume_plan()``, each a
one-line call into this class. It owns the inbox, the rollback plans and the checkpoints
this process vouches for (``PlanBook``, ``_rollback.py``), what a stop was and when the
trainer was told, and the agreement across ranks (``_agreement.py``): in a distributed job
every rank acts on the same action at the same call, or none does.

What it needs of the Monitor is handed in as a few callables (the run's records go out
through the Monitor's sender; its attempt token and last step are the Monitor's to move),
so nothing here touches the per-step path. A single process (no torch.distributed): a
rule's stop arrives in an ingest answer, the trainer is told at its next call, and the
run's end says it honoured the stop when it left within ``STOP_GRACE`` steps::

    >>> from monitor_client._restart import RestartOrder
    >>> from monitor_client._warn import Warner
    >>> control = Control("gpt-1", 0, enabled=True, warner=Warner(),
    ...     restart=RestartOrder(started=0.0, enabled=False, node_rank=0,
    ...                          flush=lambda timeout: True, timeout=1.0),
    ...     transport=lambda: None, flush=lambda timeout: True, submit=print,
    ...     progress=lambda: ("a1b2", 40))
    >>> control.receive([{"id": 1, "action": "stop", "step": 40, "rule": "StopOnNaN",
    ...                   "message": "stop requested at step 40 by rule StopOnNaN"}])
    >>> control.should_stop(), control.stop_reason()
    (True, 'stop requested at step 40 by rule StopOnNaN')
    >>> control.end_status("completed", None, last_step=42)
    ('stopped', 'stopped at step 42: stop requested at step 40 by rule StopOnNaN')
    >>> control.end_status("completed", None, last_step=40 + STOP_GRACE + 1)
    ('completed', None)
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from monitor_client._actions import ActionInbox
from monitor_client._agreement import Consensus, distributed, newest, unanimous
from monitor_client._restart import RestartOrder, agreed_resume
from monitor_client._rollback import FETCH_TIMEOUT, PlanBook, RollbackPlan, barrier
from monitor_client._transport import HttpTransport
from monitor_client._warn import Warner

__all__ = ["STOP_GRACE", "Control"]

# Steps a trainer may take after should_stop() told it to stop and still have honoured it.
STOP_GRACE = 10


class Control:
    """One process's side of the rule actions (the module docstring says what it owns).

    ``enabled``: False makes every answer "nothing to do" without a collective (set it alike
    on every rank). The Monitor hands in: ``restart``, its ``RestartOrder`` (``_restart.py``),
    which hears each action after the plan book; ``transport()``, the HTTP link to this
    rank's sidecar (the sender's); ``flush(timeout)``, which delivers what the process
    logged so far; ``submit(record)``, which sends one record urgently; and ``progress()``,
    the attempt token and the last step logged, as they are when asked (``log_step`` moves
    the step, a rollback draws a new token).
    """

    def __init__(self, run_id: str, rank: int, *, enabled: bool, warner: Warner,
                 restart: RestartOrder, transport: Callable[[], HttpTransport],
                 flush: Callable[[float], Any], submit: Callable[[dict[str, Any]], None],
                 progress: Callable[[], tuple[str, int]]) -> None:
        self.run_id, self.rank, self.enabled = run_id, rank, enabled
        self._warner = warner
        self._transport, self._flush, self._submit = transport, flush, submit
        self._progress = progress
        self._inbox = ActionInbox(self._warn_action)
        self.plans = PlanBook()
        self._inbox.add_callback(self.plans.receive)
        self.restart = restart
        self._inbox.add_callback(restart.receive)
        # should_stop()'s agreement across ranks (_agreement.py).
        self._stop_agreed, self._stop_calls, self._stop_held = False, 0, 0
        # The step at which should_stop() first told the trainer to stop: the run ends
        # "stopped" only when it then stopped there (a loop that never asked, or went on,
        # did not honour the stop, and the end record must not say it did).
        self._stop_told: int | None = None
        # Why the job stops without a rule's stop: a rollback plan it refused to load
        # (``_held_rollback``), which leaves the run on the fault the plan was to take it from.
        self._refused: str | None = None
        # Why this rank's last fetch of an action failed: the agreement record says it.
        self._last_fetch_error: str | None = None

    def _warn_action(self, where: str, exc: Exception) -> None:
        self._warner.warn(where, "action callback failed (ignored): %r", exc)

    # -- the inbox: actions in (sender thread) and read (training thread) ----------------
    def receive(self, actions: list[dict[str, Any]]) -> None:
        """Actions from an ingest answer, a poll or a fetch (duplicates are ignored)."""
        self._inbox.receive(actions)

    def poll(self, transport: HttpTransport) -> None:
        """Ask the sidecar for the actions newer than the last one seen (the sender's poll)."""
        found = transport.actions(self.run_id, self._inbox.last_id)
        if found:
            self._inbox.receive(found)

    def on_action(self, callback: Any) -> None:
        self._inbox.add_callback(callback)

    def actions(self) -> list[dict[str, Any]]:
        return self._inbox.received()

    def should_checkpoint(self) -> bool:
        return self._inbox.take_checkpoint()

    # -- stop ------------------------------------------------------------------------------
    def should_stop(self, check_every: int = 10) -> bool:
        """``Monitor.should_stop``: sticky; distributed, at agreed calls only."""
        if self._stop_agreed:
            return self._told_stop()
        dist = distributed()
        if dist is None or not self.enabled:
            if self.enabled and self._inbox.should_stop():
                return self._told_stop()
            return False
        self._stop_calls += 1
        if self._stop_calls % max(int(check_every), 1):
            return False
        mine = self._inbox.stop_action()
        agreed = newest(dist, int(mine["id"]) if mine else 0)
        if agreed == 0:
            return False
        if mine is None:
            self._fetch_actions(agreed)
            mine = self._inbox.stop_action()
        verdict = unanimous(dist, agreed, 1 if mine is not None else None)  # any stop will do
        if verdict.act:
            self._stop_agreed = True
            return self._told_stop()
        self._stop_held += 1
        if mine is None:
            self._report_held("stop", verdict, self._stop_held, int(check_every))
        return False

    def _told_stop(self) -> bool:
        if self._stop_told is None:
            self._stop_told = self._progress()[1]
        return True

    def stop_reason(self) -> str | None:
        return self._refused or self._inbox.stop_reason

    def end_status(self, status: str, error: str | None, last_step: int) -> tuple[str, str | None]:
        """The end record's ``(status, error)`` for a run that ends ``status`` at
        ``last_step``: "stopped" when the trainer was told to stop (``should_stop()``
        returned True) and stopped within ``STOP_GRACE`` steps of it (a framework finishing
        its accumulation or its logging interval); one that never asked, or trained on,
        ends as it ended."""
        told = self._stop_told
        stopped = told is not None and last_step <= told + STOP_GRACE
        if status in ("completed", "failed") and stopped:
            # The end record's step is where the trainer honoured the stop; the sidecar
            # reports that step on the alert and the actions API. A trainer that leaves
            # its loop by raising once told to stop honoured it too: not a crash.
            said = f"stopped at step {last_step}: {self.stop_reason()}"
            error = (error or said) if status == "completed" else f"{said}; it left by {error}"
            status = "stopped"
        return status, error

    # -- checkpoints a plan may send this process back to ----------------------------------
    def vouch(self, step: int, path: str) -> None:
        """This process saved (or loaded) the checkpoint of ``step`` at ``path``."""
        self.plans.vouch(int(step), path)

    def resumed_from(self, step: int, path: str | os.PathLike[str], earlier: Any = None) -> None:
        self.plans.vouch(int(step), os.fspath(path))
        if earlier is not None:
            self.plans.inherit(earlier)

    def job_checkpoints(self) -> list[list[Any]]:
        return self.plans.chain()

    # -- rollback and restart plans --------------------------------------------------------
    def resume_plan(self, checkpoint_dir: str | os.PathLike[str],
                    timeout: float = 30.0) -> RollbackPlan | None:
        """``Monitor.resume_plan``: the restart's resume point, agreed by every rank."""
        if not self.enabled:
            return None
        plan, why = agreed_resume(self._fetch_all_actions, self.restart.started,
                                  checkpoint_dir, timeout)
        if plan is None:
            if why:
                self._warner.warn("resume_plan", "no resume from the restart: %s", why)
            return None
        self.restart.resumed(plan.id)
        self.plans.applied(plan.id)
        self.plans.vouch(plan.checkpoint_step, plan.checkpoint_path)
        return plan

    def _fetch_all_actions(self) -> list[dict[str, Any]] | None:
        """The run's actions from this rank's sidecar (None: it did not answer)."""
        try:
            found: list[dict[str, Any]] | None = self._transport().actions(self.run_id, 0)
        except Exception as exc:  # noqa: BLE001 - inside a collective: never raise
            self._last_fetch_error = repr(exc)[:200]
            return None
        if found:
            self._inbox.receive(found)
        return found

    def rollback_plan(self, check_every: int = 10) -> RollbackPlan | None:
        """``Monitor.rollback_plan``: the plan every rank applies now, or None."""
        if not self.enabled:
            return None
        every = max(int(check_every), 1)
        return self.plans.agreed(every, self._fetch_actions, lambda verdict, rounds, _plan:
                                 self._held_rollback(verdict, rounds, every))

    def _held_rollback(self, verdict: Consensus, rounds: int, every: int) -> None:
        """A plan every rank holds back. One it refused (``unreported``: it names a
        checkpoint no process of the job saved) is never loaded, so the run would train on
        from the fault the plan was to take it from: it stops, as a rule's stop or a spent
        rollback budget stops it. Every rank reached this verdict at the same agreed call
        (_agreement.py), so every rank stops at its next ``should_stop()``."""
        if verdict.why == "unreported" and self._refused is None:
            self._refused = (f"rollback plan {verdict.action_id} names a checkpoint no "
                             "process of this job saved or resumed from: not loaded; "
                             "stopping, a human must look")
            self._stop_agreed = True
        self._report_held("rollback", verdict, rounds, every)

    def _report_held(self, action: str, verdict: Consensus, rounds: int, every: int) -> None:
        """Tell the sidecar this rank held the job's action back (it pages that); at the
        1st, 2nd, 4th, 8th, ... agreed call in a row, so a lasting hold is told, not
        flooded."""
        if rounds & (rounds - 1):
            return
        if verdict.why == "unreported":
            self._warner.warn("rollback_unreported", "rollback plan %d names a checkpoint no "
                              "rank of this job reported with checkpoint_saved() (or "
                              "resumed_from()): it is not loaded, and the run stops "
                              "(should_stop())", verdict.action_id)
        why = {"missing": "this rank's sidecar does not have it",
               "unreported": "no rank of this job reported the checkpoint it names "
                             "(checkpoint_saved): it is not loaded"}.get(
            verdict.why, "this rank holds another content under the same id")
        attempt, step = self._progress()
        self._submit({"kind": "agreement", "run_id": self.run_id, "attempt": attempt,
                      "rank": self.rank, "time": time.time(), "step": step,
                      "action_id": verdict.action_id, "action": action,
                      "outcome": verdict.why, "rounds": rounds, "check_every": every,
                      "detail": f"{why} ({self._last_fetch_error or 'no error fetching'})"})

    def _fetch_actions(self, plan_id: int) -> None:
        try:
            found = self._transport().actions(self.run_id, max(plan_id - 1, 0))
            self._last_fetch_error = None if found is not None else \
                "the actions endpoint did not answer"
            if found:
                self._inbox.receive(found)
        except Exception as exc:  # noqa: BLE001 - inside a collective: never raise
            self._last_fetch_error = repr(exc)[:200]
            self._warner.warn("rollback_plan", "fetching action %d failed: %r",
                              plan_id, exc)

    def rolled_back(self, plan: RollbackPlan) -> None:
        """The ranks leave the abandoned branch together: each delivers what it logged
        under the old token (bounded by ``FETCH_TIMEOUT``), then, distributed, all meet at a
        barrier and mark the plan applied (the Monitor then draws the new attempt)."""
        self._flush(FETCH_TIMEOUT)
        barrier(self.plans.applied, plan.id)
