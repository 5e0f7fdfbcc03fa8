"""A restart the run's leader decided: every rank leaves at once, and the relaunched job
resumes from the plan's checkpoint.

The sidecar's ``action: restart`` (or ``exclude``: the same, with a sick node left out;
monitor_agent/alerting/restart.py) reaches every rank in its sidecar's answers and polls,
on the sender thread. The training thread may be the one that is stuck (blocked in a
collective, a dead GPU's kernel), so it is never asked: ``RestartOrder`` acts from a thread
of its own. It says so on stderr and in the ``monitor_client`` log, delivers what is logged
(at most ``close_timeout``: the spool keeps the rest for the relaunched process), and ends
the process with ``RESTART_EXIT`` (75, ``EX_TEMPFAIL``, the same status a framework
callback's rollback exits with: one launcher mechanism for both). On a node the plan leaves
out, under torchrun, it first sends its elastic agent SIGTERM: the agent leaves the
rendezvous and the other nodes re-form without it (``--nnodes=MIN:MAX``); a scheduler
(Slurm, Kubernetes) keeps the node out through its own drain (the node's sidecar,
monitor_agent/cluster/drain.py).

It acts only on a restart decided while this process ran (its ``created_at`` after the
process began): the relaunched processes see the same decision in their first answers and
must not leave again, and they are the ones it was for. Only when the launcher runs the
process again (``_launcher.py``; ``MonitorSettings.restart_exit``): otherwise leaving would
only end the job, and the rank warns instead.

``resume_plan`` is the relaunched side: at start, before training, every rank asks its
sidecar for the restart that relaunched the job, and all take its plan together, or none
(the same agreement as a rollback plan's, ``_agreement.py``), as a ``RollbackPlan`` with
no new window: load ``checkpoint_path``, resume the data at ``resume_position`` leaving
the ``skip`` windows out. A plan is taken only when its checkpoint lies inside the
directory the script names (``checkpoint_dir``): a plan can only send the job back to one
of its own saves, whoever wrote the sidecar's ledger.

A relaunched process on a node the restart that relaunched it leaves out, under torchrun,
leaves at once (``resumed``): its worker died before it read the decision (the others'
exit broke its collective first) and its agent, which was to leave, ran it again and took
it back into the rendezvous. It sends its agent SIGTERM and exits with 75; the others fail
their next collective and re-form without this node. The node is the machine, as the plan
names it (``host``: Kubernetes' node, else the hostname), since node ranks move when the
job re-forms.

A restart decided after this process began is carried out once; one from before it is the
one that relaunched it::

    >>> left = []
    >>> order = RestartOrder(started=1000.0, enabled=True, node_rank=0, flush=lambda t: True,
    ...                      timeout=0.1, exit=left.append, threaded=False)
    >>> order.receive({"id": 4, "action": "restart", "created_at": 990.0,
    ...                "plan": {"cause": "hang", "fault_step": 9, "ranks": 2}})
    >>> order.receive({"id": 5, "action": "restart", "created_at": 1010.0,
    ...                "message": "restart all 2 ranks from checkpoint 8",
    ...                "plan": {"cause": "hang", "fault_step": 9, "ranks": 2}})
    >>> left, order.taken
    ([75], 5)
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monitor_client._agreement import any_rank, content_digest, distributed, newest, unanimous
from monitor_client._resume import ROLLBACK_EXIT
from monitor_client._rollback import RollbackPlan

__all__ = ["RESTART_ACTIONS", "RESTART_EXIT", "RestartOrder", "agreed_resume",
           "newest_restart", "resume_plan_of"]

log = logging.getLogger("monitor_client")

RESTART_EXIT = ROLLBACK_EXIT
"""The exit status of a process that leaves so that its launcher runs it again (75)."""
RESTART_ACTIONS = ("restart", "exclude")
_AGENTS = ("torch.distributed.run", "torchrun", "torch/distributed/run.py")


class RestartOrder:
    """Carries out the run's restart decisions on this process (module docstring)."""

    def __init__(self, *, started: float, enabled: bool, node_rank: int | None,
                 flush: Callable[[float], Any], timeout: float,
                 exit: Callable[[int], Any] = os._exit, agent: bool = False,
                 threaded: bool = True, host: str | None = None) -> None:
        self.started, self.enabled, self.node_rank = started, enabled, node_rank
        self.host = host  # this process's machine, as a plan's ExcludedNode names it
        self.flush, self.timeout, self.exit = flush, timeout, exit
        self.agent = agent  # under torchrun: its elastic agent is this process's parent
        self.threaded = threaded
        self.taken: int | None = None  # the restart this process left for
        self._resumed: set[int] = set()  # restarts this process resumed from
        self._warned: set[int] = set()
        self._leaving: dict[int, dict[str, Any]] = {}  # restarts that leave this host out
        self._lock = threading.Lock()

    def resumed(self, action_id: int) -> None:
        """This process is the relaunch that ``action_id`` asked for: never leave for it,
        unless it leaves this process's host out and torchrun's agent took the node back
        (module docstring): then leave now."""
        with self._lock:
            self._resumed.add(int(action_id))
            action = self._leaving.get(int(action_id))
            if action is None or not (self.enabled and self.agent) or self.taken is not None:
                return
            self.taken = int(action_id)
        self._leave(action, relaunched=True)

    def receive(self, action: dict[str, Any]) -> None:
        """An action from the sidecar (sender thread): leave if it is a restart for us."""
        if action.get("action") not in RESTART_ACTIONS or not _open(action):
            return
        created, action_id = action.get("created_at"), action.get("id")
        if not isinstance(created, int | float) or not isinstance(action_id, int):
            return
        with self._lock:
            if self.host is not None and self.host in _hosts_out(action):
                self._leaving[action_id] = action
            if created <= self.started or action_id in self._resumed or \
                    self.taken is not None:
                return
            if not self.enabled:
                if action_id not in self._warned:
                    self._warned.add(action_id)
                    _say(f"restart {action_id} decided ({action.get('message') or ''}), but "
                         f"this process does not leave for it: its launcher does not run it "
                         f"again on exit status {RESTART_EXIT} (MonitorSettings.restart_exit,"
                         f" MONITOR_AGENT_RESTARTS=1)")
                return
            self.taken = action_id
        if self.threaded:
            threading.Thread(target=self._leave, args=(action,), daemon=True,
                             name="monitor_client-restart").start()
        else:
            self._leave(action)

    def _leave(self, action: dict[str, Any], relaunched: bool = False) -> None:
        found = action.get("plan")
        plan: dict[str, Any] = found if isinstance(found, dict) else {}
        out = [n.get("node") for n in plan.get("exclude") or () if isinstance(n, dict)]
        excluded = relaunched or (self.node_rank is not None and self.node_rank in out)
        _say(f"{action.get('message') or 'restart'} (action {action.get('id')}, rule "
             f"{action.get('rule') or '?'}): " + (
                 f"this process was run again on {self.host}, which it leaves out: it exits "
                 f"with {RESTART_EXIT} and its node leaves the job" if relaunched else
                 f"this process exits with {RESTART_EXIT} for its launcher to run the job "
                 "again" + ("; this node is left out" if excluded else "")))
        if excluded and self.agent:
            _leave_rendezvous()
        try:
            self.flush(self.timeout)
        except Exception as exc:  # noqa: BLE001 - leaving matters more than the last records
            log.warning("monitor_client: flushing before the restart failed: %r", exc)
        self.exit(RESTART_EXIT)


def _hosts_out(action: dict[str, Any]) -> set[str]:
    """The machines a restart's plan leaves out (``ExcludedNode.host``)."""
    found = action.get("plan")
    plan: dict[str, Any] = found if isinstance(found, dict) else {}
    return {n["host"] for n in plan.get("exclude") or ()
            if isinstance(n, dict) and isinstance(n.get("host"), str)}


def _open(action: dict[str, Any]) -> bool:
    return action.get("honoured_step") is None and action.get("withdrawn_by") is None


def _leave_rendezvous() -> None:
    """SIGTERM this process's parent when it is torchrun's elastic agent: the agent stops
    its workers and leaves, and the other nodes re-form without this one."""
    try:
        with open(f"/proc/{os.getppid()}/cmdline", "rb") as src:
            args = src.read(64 * 1024).decode(errors="replace")
    except OSError:
        return
    if any(agent in args for agent in _AGENTS):
        os.kill(os.getppid(), signal.SIGTERM)


def _say(text: str) -> None:
    """On stderr, once: through the ``monitor_client`` logger when the script configured
    logging (its handlers see it), else printed (a warning nobody configured is lost)."""
    line = f"monitor_client: {text}"
    if logging.getLogger().handlers or log.handlers:
        log.warning("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)


def newest_restart(actions: list[dict[str, Any]], before: float) -> dict[str, Any] | None:
    """The newest open restart decided before ``before`` (this process's start) whose plan
    names a checkpoint: the one the job was relaunched for."""
    found = [a for a in actions if a.get("action") in RESTART_ACTIONS and _open(a)
             and isinstance(a.get("id"), int) and isinstance(a.get("created_at"), int | float)
             and a["created_at"] <= before and resume_plan_of(a) is not None]
    return max(found, key=lambda a: a["id"]) if found else None


def resume_plan_of(action: dict[str, Any]) -> RollbackPlan | None:
    """A restart action's resume point as a ``RollbackPlan`` with no new window (None: it
    names no checkpoint, or is malformed)."""
    plan = action.get("plan")
    if not isinstance(plan, dict):
        return None
    step, path = plan.get("checkpoint_step"), plan.get("checkpoint_path")
    skip = plan.get("skip") or []
    if not isinstance(step, int) or isinstance(step, bool) or step < 0 or \
            not isinstance(path, str) or not path or not isinstance(skip, list):
        return None
    try:
        windows = tuple((int(w[0]), int(w[1])) for w in skip)
        position = plan.get("resume_position")
        return RollbackPlan(
            id=int(action["id"]), rule=str(action.get("rule") or ""),
            message=str(action.get("message") or ""),
            step=int(plan.get("fault_step") or step), checkpoint_step=step,
            checkpoint_path=path, skip_from=step + 1, skip_to=step, lr_factor=None,
            lr_steps=None, number=int(plan.get("number") or 1),
            budget=int(plan.get("budget") or 1),
            resume_position=int(position) if position is not None else step, skip=windows,
            positions="steps" if plan.get("positions") == "steps" else "positions",
            digest=content_digest(action))
    except (KeyError, TypeError, ValueError):
        return None


def within(path: str, directory: str | os.PathLike[str]) -> bool:
    """Whether ``path`` resolves inside ``directory`` (links followed, on both)."""
    try:
        base = Path(directory).resolve(strict=True)
        target = Path(path).resolve()
    except (OSError, RuntimeError):
        return False
    return target == base or base in target.parents


def agreed_resume(fetch: Callable[[], list[dict[str, Any]] | None], started: float,
                  checkpoint_dir: str | os.PathLike[str], timeout: float,
                  clock: Callable[[], float] = time.monotonic,
                  pause: Callable[[float], Any] = time.sleep) -> tuple[RollbackPlan | None, str]:
    """The plan every rank resumes from, or None, and why not ("" when there is no
    restart to resume from). ``fetch`` asks this rank's sidecar for the run's actions (None:
    no answer). A rank whose sidecar has not adopted the leader's decision yet asks again
    until ``timeout``; the job's ranks then agree as for a rollback plan."""
    deadline = clock() + timeout
    dist = distributed()
    found: dict[str, Any] | None = None
    while True:
        actions = fetch()
        if actions is not None:
            found = newest_restart(actions, started)
        mine = found["id"] if found is not None else 0
        wanted = newest(dist, mine) if dist is not None else mine
        lacking, expired = actions is None or mine != wanted, clock() >= deadline
        if dist is not None:  # every rank decides the same: go on or ask again
            lacking, expired = any_rank(dist, lacking, expired)
        if not lacking or expired:
            break
        pause(0.2)
    plan = resume_plan_of(found) if found is not None and found["id"] == wanted else None
    known = plan is not None and within(plan.checkpoint_path, checkpoint_dir)
    if dist is not None:
        if wanted == 0:
            return None, ""
        verdict = unanimous(dist, wanted, plan.digest if plan is not None else None, known)
        if not verdict.act:
            return None, {"missing": "a rank's sidecar does not have the restart",
                          "mismatch": "the ranks hold different plans under one id",
                          "unreported": "its checkpoint is not inside checkpoint_dir"}.get(
                verdict.why, verdict.why)
        return plan, ""
    if plan is None:
        return None, "" if wanted == 0 else "the sidecar did not answer"
    if not known:
        return None, (f"its checkpoint {plan.checkpoint_path} is not inside "
                      f"checkpoint_dir {os.fspath(checkpoint_dir)}")
    return plan, ""
