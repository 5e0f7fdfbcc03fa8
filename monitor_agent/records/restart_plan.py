"""The plan of a ``restart`` or ``exclude`` action: a typed value, one parser, one wording.

A rule's ``action: restart`` (alerting/restart.py decides it) asks every rank of the job to
leave at once with the exit status its launcher treats as "run me again" (75, the client's
``RESTART_EXIT``), and the relaunched job to resume from a **resume point**: the run's last
clean checkpoint before the fault, the data position its state resumes from, and the data
windows earlier rollbacks skip (docs/actions.md, "Healing"). ``action: exclude`` is the same
restart with one or more nodes left out (``exclude``): a node the evidence names as sick.

The plan travels as JSON in the action's ``plan`` (the ingest answer, ``GET
/v1/runs/{id}/actions``, a node sidecar adopting its leader's decisions) and is parsed back
here, once, by every reader on the sidecar: a plan that does not parse is not acted on.
The client reads the same fields (client/monitor_client/_restart.py); docs/action.schema.json
states them (generated from these types: ``python -m monitor_agent.records.actions``), and
tests/records/test_action_schema.py checks both sides against it.

A restart of a 16-rank, 2-node job from its clean checkpoint of step 400, node 1 left out::

    >>> plan = RestartPlan(cause="hang", fault_step=412, ranks=16, nodes=2,
    ...     checkpoint_step=400, checkpoint_path="/ckpt/400.pt", resume_position=400,
    ...     exclude=(ExcludedNode(1, host="gpu-node-1", ranks=tuple(range(8, 16)),
    ...                           why="2nd fault in 1 h"),), number=1, budget=3)
    >>> plan.describe()
    'restart all 16 ranks from checkpoint 400 (clean; /ckpt/400.pt, data position 400); node 1 (gpu-node-1) left out: 2nd fault in 1 h'
    >>> plan.describe(done=True)[:48]
    'restarted all 16 ranks from checkpoint 400 (clea'
    >>> RestartPlan.from_dict(plan.to_dict()) == plan
    True
    >>> RestartPlan.from_dict({"cause": "hang"}) is None      # a plan with holes: no plan
    True
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from monitor_agent.records.plan_fields import count, text, window

__all__ = ["CAUSE_MAX", "ExcludedNode", "RestartPlan"]

CAUSE_MAX = 64  # a cause is a finding type or condition ("hang", "xid 79"): short


@dataclass(frozen=True, slots=True)
class ExcludedNode:
    """A node the restart leaves out: its node rank in the job when decided, its host, the
    id of its sidecar as the run's leader hears it over the peer link (what that sidecar
    recognises itself by: cluster/drain.py), its ranks then, and why."""

    node: int
    host: str | None = None
    sidecar: str | None = None
    ranks: tuple[int, ...] = ()
    why: str = ""

    def name(self) -> str:
        return f"node {self.node}" + (f" ({self.host})" if self.host else "")

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "sidecar": self.sidecar,
                "ranks": list(self.ranks), "why": self.why}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ExcludedNode:
        """ValueError or TypeError for a dict that is not one."""
        ranks = data.get("ranks") or []
        if not isinstance(ranks, list) or len(ranks) > 1_000_000:
            raise ValueError("ranks: a list")
        return cls(node=count(data.get("node")), host=text(data.get("host")),
                   sidecar=text(data.get("sidecar")),
                   ranks=tuple(count(r) for r in ranks), why=text(data.get("why")) or "")


@dataclass(frozen=True, slots=True)
class RestartPlan:
    """What a restart decision asks (module docstring). ``checkpoint_step`` None: the run
    has no clean checkpoint before the fault, and the job starts over as its script does
    without one. ``skip``/``positions``: the windows earlier rollbacks skip, in their unit
    (``positions``, or ``steps`` for a run without data positions), which the resumed run
    keeps skipping. ``attempt``: the leader's number of the attempt it restarts;
    ``number``/``budget``: this run's restarts within the last ``window_seconds`` and how
    many it may take there."""

    cause: str
    fault_step: int
    ranks: int
    nodes: int = 1
    checkpoint_step: int | None = None
    checkpoint_path: str | None = None
    resume_position: int | None = None
    skip: tuple[tuple[int, int], ...] = ()
    positions: str = "positions"
    exclude: tuple[ExcludedNode, ...] = ()
    fault_node: int | None = None  # the node the evidence put the fault on, if one,
    fault_host: str | None = None  # and its host (node ranks change across restarts)
    attempt: int = 1
    number: int = 1
    budget: int = 1
    window_seconds: float = 3600.0

    @property
    def resume_step(self) -> int:
        """The first step the relaunched job trains (1 when it starts over)."""
        return (self.checkpoint_step or 0) + 1

    @property
    def left(self) -> int:
        """The nodes the job runs on after the restart."""
        return max(self.nodes - len(self.exclude), 0)

    def describe(self, done: bool = False) -> str:
        """The sentence a page carries of the decision (``done``: once carried out)."""
        who = f"all {self.ranks} ranks" if self.ranks > 1 else "the job"
        if self.checkpoint_step is None:
            where = "from the start (no clean checkpoint before the fault)"
        else:
            data = (f", data position {self.resume_position}"
                    if self.positions == "positions" and self.resume_position is not None
                    else "")
            where = f"from checkpoint {self.checkpoint_step} (clean; {self.checkpoint_path}{data})"
        text = f"{'restarted' if done else 'restart'} {who} {where}"
        for node in self.exclude:
            text += f"; {node.name()} left out" + (f": {node.why}" if node.why else "")
        return text

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cause": self.cause, "fault_step": self.fault_step, "ranks": self.ranks,
            "nodes": self.nodes, "checkpoint_step": self.checkpoint_step,
            "checkpoint_path": self.checkpoint_path, "resume_position": self.resume_position,
            "skip": [list(w) for w in self.skip], "positions": self.positions,
            "exclude": [n.to_dict() for n in self.exclude], "fault_node": self.fault_node,
            "fault_host": self.fault_host,
            "attempt": self.attempt, "number": self.number, "budget": self.budget,
            "window_seconds": self.window_seconds}
        return out

    @classmethod
    def from_dict(cls, data: Any) -> RestartPlan | None:
        """The plan of an action's ``plan`` dict, or None when it is not a whole one (a plan
        with holes must not half-apply: the same rule as a rollback plan's)."""
        if not isinstance(data, Mapping):
            return None
        try:
            skip = data.get("skip") or []
            exclude = data.get("exclude") or []
            if not isinstance(skip, list) or not isinstance(exclude, list):
                return None
            step = data.get("checkpoint_step")
            path = text(data.get("checkpoint_path"), 4096)
            if (step is None) != (path is None):
                return None
            seconds = data.get("window_seconds", 3600.0)
            if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
                    not math.isfinite(seconds) or seconds <= 0:
                return None
            plan = cls(
                cause=text(data.get("cause"), CAUSE_MAX) or "",
                fault_step=count(data.get("fault_step")), ranks=count(data.get("ranks")),
                nodes=count(data.get("nodes", 1)),
                checkpoint_step=None if step is None else count(step), checkpoint_path=path,
                resume_position=None if data.get("resume_position") is None
                else count(data.get("resume_position")),
                skip=tuple(window(w) for w in skip),
                positions="steps" if data.get("positions") == "steps" else "positions",
                exclude=tuple(ExcludedNode.from_dict(n) for n in exclude
                              if isinstance(n, Mapping)),
                fault_node=None if data.get("fault_node") is None
                else count(data.get("fault_node")),
                fault_host=text(data.get("fault_host")),
                attempt=count(data.get("attempt", 1)), number=count(data.get("number", 1)),
                budget=count(data.get("budget", 1)), window_seconds=float(seconds))
        except (TypeError, ValueError):
            return None
        if not plan.cause or plan.ranks < 1 or plan.nodes < 1:
            return None
        return plan
