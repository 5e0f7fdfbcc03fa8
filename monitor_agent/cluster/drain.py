"""This node left out of a run by its leader's decision: said where the cluster's own tooling
reads it, and carried out by the command the operator configured, never one from a record.

A ``restart`` or ``exclude`` action (alerting/restart.py) may leave nodes out, each named by
the id of its sidecar as the leader hears it over the peer link (the leader's own node: by
being the leader). The sidecar so named (the leader deciding, a node sidecar adopting the
decision) **drains its own node**:

- it keeps the fact in ``<data_dir>/drained.json`` (it survives a restart), and in
  ``state_file`` when set (a path on the node's own disk, where Node Problem Detector's
  custom plugin reads it: deploy/kubernetes/node-problem-detector/, so the cluster's
  tooling cordons the node); it serves it at ``GET /v1/node`` and as
  ``monitor_agent_node_drained`` on ``/metrics``; ``DELETE /v1/node/drain`` clears it once
  the node is repaired;
- ``cluster.drain.mode`` says what else it runs: ``none`` (the default: the job's launcher
  leaves the node out on its own, torchrun's agent leaving the rendezvous), ``slurm``
  (``scontrol update NodeName=<node_name> State=DRAIN Reason=<reason>``: the requeued job
  is not placed there again) or ``command`` (the operator's argv, with
  ``MONITOR_AGENT_DRAIN_NODE``, ``..._REASON``, ``..._RUN`` in its environment).

The argv is the operator's configuration; what comes from the decision (the reason, built
here from its action id, run id and cause) is passed as one argument or an environment
value, cleaned to a short plain string: no shell ever sees it. The command runs on a thread
of its own (``timeout_seconds``), never on the engine's.

    >>> reason_of("job-7", 3, "hard GPU error (xid 79) at step 200; $(reboot)")
    'monitor-agent run job-7 action 3: hard GPU error (xid 79) at step 200 (reboot)'
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["DRAIN_FILE", "DrainSettings", "Drained", "NodeDrain", "reason_of"]

log = logging.getLogger(__name__)
DRAIN_FILE = "drained.json"
_REASON = re.compile(r"[^A-Za-z0-9 ._:,()/=+-]")
_REASON_MAX = 200


class DrainSettings(BaseModel):
    """How this sidecar's node is drained when a run's leader leaves it out."""

    model_config = ConfigDict(extra="forbid")

    mode: Literal["none", "slurm", "command"] = Field(
        default="none", description="none: only say so (GET /v1/node, for Node Problem "
        "Detector; the job's launcher leaves the node out itself); slurm: scontrol update "
        "NodeName=<node_name> State=DRAIN Reason=...; command: run `command`.")
    command: list[str] = Field(
        default_factory=list, max_length=64, description="mode command: the argv to run "
        "(no shell), with MONITOR_AGENT_DRAIN_NODE, MONITOR_AGENT_DRAIN_REASON and "
        "MONITOR_AGENT_DRAIN_RUN in its environment.")
    node_name: str | None = Field(
        default=None, max_length=255, pattern=r"^[A-Za-z0-9._-]+$",
        description="This node's name in the scheduler (default: the short hostname).")
    timeout_seconds: float = Field(default=30.0, gt=0, le=600,
                                   description="How long the drain command may run.")
    state_file: str | None = Field(
        default=None, max_length=4096, description="Also write the drain's state here (JSON; "
        "removed when cleared): a path on the node that Node Problem Detector's plugin "
        "reads (deploy/kubernetes/node-problem-detector/).")


@dataclass(frozen=True, slots=True)
class Drained:
    """What drained this node: the run, the action, why, when, and how the command went."""

    run_id: str
    action_id: int
    reason: str
    at: float
    mode: str
    outcome: str = "pending"  # pending | done | failed: <why> | recorded (mode none)


def reason_of(run_id: str, action_id: int, why: str) -> str:
    """The reason a scheduler records, from the decision: short, plain characters only."""
    text = f"monitor-agent run {run_id} action {action_id}: {why}"
    return re.sub(r" +", " ", _REASON.sub("", text)).strip()[:_REASON_MAX]


class NodeDrain:
    """This node's drain state and the configured way to carry one out."""

    def __init__(self, settings: DrainSettings, data_dir: Path | str,
                 run: Callable[..., subprocess.CompletedProcess[str]] = subprocess.run,
                 clock: Callable[[], float] = time.time,
                 on_change: Callable[[bool], object] = lambda drained: None) -> None:
        self.settings = settings
        self.path = Path(data_dir) / DRAIN_FILE
        self.node_name = settings.node_name or socket.gethostname().split(".")[0]
        self._run, self._clock, self._on_change = run, clock, on_change
        self._lock = threading.Lock()
        self._state: Drained | None = self._load()
        on_change(self._state is not None)

    def state(self) -> Drained | None:
        with self._lock:
            return self._state

    def drain(self, run_id: str, action_id: int, why: str) -> bool:
        """Drain this node for action ``action_id`` of ``run_id``; False when it is already
        drained for that action. The command (if any) runs on a thread of its own."""
        with self._lock:
            if self._state is not None and (self._state.run_id, self._state.action_id) == (
                    run_id, action_id):
                return False
            outcome = "recorded" if self.settings.mode == "none" else "pending"
            self._state = Drained(run_id, action_id, reason_of(run_id, action_id, why),
                                  self._clock(), self.settings.mode, outcome)
            self._save(self._state)
        self._on_change(True)
        log.warning("node %s left out of run %s (action %d): %s; drain mode %s",
                    self.node_name, run_id, action_id, why, self.settings.mode)
        if self.settings.mode != "none":
            threading.Thread(target=self._carry_out, args=(self._state,), daemon=True,
                             name="node-drain").start()
        return True

    def clear(self) -> bool:
        """The node is back in service (an operator said so); False if it was not drained."""
        with self._lock:
            was, self._state = self._state, None
            self.path.unlink(missing_ok=True)
            if self.settings.state_file:
                Path(self.settings.state_file).unlink(missing_ok=True)
        self._on_change(False)
        if was is not None:
            log.warning("node %s back in service (was left out of run %s, action %d)",
                        self.node_name, was.run_id, was.action_id)
        return was is not None

    def argv(self, state: Drained) -> list[str]:
        if self.settings.mode == "slurm":
            return ["scontrol", "update", f"NodeName={self.node_name}", "State=DRAIN",
                    f"Reason={state.reason}"]
        return list(self.settings.command)

    def _carry_out(self, state: Drained) -> None:
        argv = self.argv(state)
        env = {**os.environ, "MONITOR_AGENT_DRAIN_NODE": self.node_name,
               "MONITOR_AGENT_DRAIN_REASON": state.reason,
               "MONITOR_AGENT_DRAIN_RUN": state.run_id}
        try:
            done = self._run(argv, env=env, capture_output=True, text=True,
                             timeout=self.settings.timeout_seconds, check=False)
            outcome = "done" if done.returncode == 0 else (
                f"failed: exit {done.returncode}: {(done.stderr or done.stdout).strip()[:300]}")
        except (OSError, subprocess.SubprocessError) as exc:
            outcome = f"failed: {type(exc).__name__}: {str(exc)[:300]}"
        (log.info if outcome == "done" else log.error)(
            "drain of node %s (%s): %s", self.node_name, " ".join(argv[:2]), outcome)
        with self._lock:
            if self._state is not None and self._state.action_id == state.action_id and \
                    self._state.run_id == state.run_id:
                self._state = Drained(**{**asdict(state), "outcome": outcome})
                self._save(self._state)

    def to_dict(self) -> dict[str, Any]:
        """What ``GET /v1/node`` answers."""
        state = self.state()
        return {"node_name": self.node_name, "drained": state is not None,
                "mode": self.settings.mode, **({} if state is None else {
                    "run_id": state.run_id, "action_id": state.action_id,
                    "reason": state.reason, "at": state.at, "outcome": state.outcome})}

    def _save(self, state: Drained) -> None:
        text = json.dumps({"node_name": self.node_name, "drained": True, **asdict(state)})
        for path in (self.path, *([Path(self.settings.state_file)]
                                  if self.settings.state_file else [])):
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(text)
                os.replace(tmp, path)
            except OSError as exc:  # the state file is a courtesy; the data dir is not
                if path == self.path:
                    raise
                log.error("cannot write the drain state file %s: %r", path, exc)

    def _load(self) -> Drained | None:
        try:
            data = json.loads(self.path.read_text())
            return Drained(run_id=str(data["run_id"]), action_id=int(data["action_id"]),
                           reason=str(data["reason"])[:_REASON_MAX], at=float(data["at"]),
                           mode=str(data["mode"]), outcome=str(data.get("outcome", "")))
        except (OSError, ValueError, KeyError, TypeError):
            return None
