"""``action: restart`` and ``action: exclude``: heal a hardware-class fault with no person in
the loop, through the launcher the job already runs under.

A rule with ``action: restart`` (the packaged rules put it on a hang past its limit, a rank
gone, and a hard GPU fault) decides, on the run's leader, one restart for every rank: each
rank's client leaves at once with the exit status its launcher treats as "run me again"
(75: torchrun elastic restarts the worker group on any non-zero exit while
``--max-restarts`` lasts; Slurm's batch script requeues on it; a Kubernetes Job or JobSet
restarts the pod), the stuck rank included (its training thread is blocked, the client's
own thread is not). The relaunched job resumes from the plan's **resume point**: the run's
last clean checkpoint before the fault, at the data position its state resumes from,
keeping every window earlier rollbacks skipped (``records/restart_plan.py`` ``RestartPlan``).

``decide`` returns one of three values:

- ``Restart``: the plan, and whether it leaves nodes out (``kind`` "exclude"). A node is
  left out on **node-level evidence** only: a hard GPU error on it (``gpu_health``
  critical: the GPU lost, uncorrectable ECC, a failed remap, an XID meaning lost data or a
  lost GPU); the same node at fault in a second incident within ``restart_window``; or an
  ``action: exclude`` rule on a finding that names a node (the sick-node verdict's). A
  single soft signal (one hang, one NaN, one slow step) never leaves a node out, and a
  run on one node has no other node to compare with: "the same node twice" needs two.
- ``Stop``: the run cannot be healed safely, and a human must look (the page says why):
  its restarts in the last ``restart_window`` reached ``restart_budget``; the same fault
  came back within ``restart_cure_steps`` of the last restart's resume with no node to
  leave out (the restart did not cure it: stop, never loop); leaving the node out would
  exceed the run's ``exclude_budget`` or leave fewer nodes than the job's minimum (no
  spare capacity).
- ``Hold``: no action, and the page says why: the stuck rank is in an evaluation or a
  checkpoint save (a slow phase is not a fault to restart for), or the job's launcher does
  not restart it (its run record's ``launcher`` says so, or says nothing): then a restart
  would only end it.

Acting on a partial view (the leader does not hear every node) never happens: the
episode's ``_act`` refuses a partial finding before this is asked (alerting/episodes.py).

A two-node job of 4 ranks under torchrun elastic (``--nnodes=1:2``: it can run on one),
rank 3 (node 1) gone at step 412, clean checkpoints at 300 and 400::

    >>> from monitor_agent.records.types import LauncherDeclaration, Severity
    >>> rule = Rule(name="RestartOnHang", types=("hang",), channels=("console",), cooldown=60,
    ...             repeat_interval=3600, resolve_after=600, action="restart")
    >>> gone = Finding("hang", Severity.CRITICAL, "job", step=412, rank=3, message="gone",
    ...                evidence={"hung_ranks": [0, 1, 2], "gone_ranks": [3], "ranks": {}})
    >>> nodes = (NodeView(0, "gpu-node-0", None, (0, 1)), NodeView(1, "gpu-node-1", "bb", (2, 3)))
    >>> elastic = LauncherDeclaration("torchrun", True, 0, 3, min_nodes=1)
    >>> run = RunContext("job", clean_checkpoints=((300, "/c/300.pt"), (400, "/c/400.pt")),
    ...                  checkpoint_positions={400: 400}, world=4, nodes=nodes,
    ...                  launcher=elastic)
    >>> first = decide(rule, gone, run, history=(), now=1000.0)
    >>> first.kind, first.plan.describe()
    ('restart', 'restart all 4 ranks from checkpoint 400 (clean; /c/400.pt, data position 400)')

Rank 3 gone again 20 minutes later, at step 960, well past the first restart's resume:
node 1 at fault in a second incident within the hour, so it is left out::

    >>> later = Finding("hang", Severity.CRITICAL, "job", step=960, rank=3, message="gone",
    ...                 evidence={"hung_ranks": [0, 1, 2], "gone_ranks": [3], "ranks": {}})
    >>> past = (Past(1000.0, "restart", first.plan, honoured_step=401),)
    >>> run = replace(run, clean_checkpoints=((400, "/c/400.pt"), (900, "/c/900.pt")),
    ...               checkpoint_positions={})
    >>> again = decide(rule, later, run, past, now=2200.0)
    >>> again.kind, again.plan.describe()
    ('exclude', 'restart all 4 ranks from checkpoint 900 (clean; /c/900.pt); node 1 (gpu-node-1) left out: 2nd incident on it within 1 h (gone at step 412 and at step 960)')

But a job that needs both of its nodes (no minimum declared: it runs on the nodes it has,
and there is no spare to take node 1's place) stops instead::

    >>> static = replace(run, launcher=LauncherDeclaration("torchrun", True, 0, 3))
    >>> print(decide(rule, later, static, past, now=2200.0).why)
    leaving node 1 (gpu-node-1) out leaves 1 node, below the job's minimum of 2: stopping; a human must look

And a hang that names no node (every rank waits in the same collective) 30 steps after a
restart resumed is one the restart did not cure::

    >>> stuck = Finding("hang", Severity.CRITICAL, "job", step=960, rank=0, message="hung",
    ...                 evidence={"hung_ranks": [0, 1, 2, 3], "gone_ranks": [], "ranks": {}})
    >>> print(decide(rule, stuck, run, now=2200.0,
    ...              history=(Past(1000.0, "restart", first.plan, honoured_step=930),)).why)
    the restart did not cure it: hang again at step 960, 30 steps after the restart resumed at step 930 (restart_cure_steps 100): stopping; a human must look
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.alerting.rollback import onset_of
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import ExcludedNode, Hold, Restart, RestartPlan, Stop
from monitor_agent.records.types import Finding, Severity

__all__ = ["SLOW_PHASES", "NodeFault", "Hold", "Past", "Restart", "Stop", "decide", "fault_of",
           "kind_of", "repeated"]

SLOW_PHASES = frozenset({"eval", "checkpoint"})
"""Where a rank may legitimately be slow for longer than a step: never restarted for."""
SCHEDULERS = frozenset({"slurm", "kubernetes"})
"""Launchers whose restart asks the scheduler for the job's nodes again: a node left out is
replaced from the cluster's spare capacity (the scheduler's to find), not lost to the job."""


@dataclass(frozen=True, slots=True)
class Past:
    """An earlier action of the run that healed a fault (a restart, an exclusion or a
    rollback): when decided, its kind, its plan, and the step its resumed attempt began at
    (None while pending)."""

    at: float
    kind: str
    plan: RestartPlan | None = None
    honoured_step: int | None = None
    fault_node: int | None = None  # a rollback's, which has no RestartPlan
    fault_host: str | None = None
    fault_step: int | None = None
    cause: str | None = None


GPU_CONDITIONS = frozenset({"gpu_lost", "ecc_uncorrectable", "row_remap_failure",
                            "row_remap_pending", "xid", "pcie_degraded", "throttle"})


@dataclass(frozen=True, slots=True)
class NodeFault:
    """What a finding says failed: its cause (``hang``, ``gone``, ``xid 79``, ...), the node
    it names (None: no single node), whether that is hard node-level evidence on its own,
    the step it was seen at, and the first step whose state is suspect."""

    cause: str
    node: int | None
    hard: bool
    step: int
    suspect_from: int
    ranks: tuple[int, ...] = field(default=())

    @property
    def kind(self) -> str:
        return kind_of(self.cause)


def kind_of(cause: str) -> str:
    """The class a repeat is compared by: ``hang`` (hung or gone), ``gpu``, or the cause.

        >>> kind_of("gone"), kind_of("xid 79"), kind_of("nan_inf")
        ('hang', 'gpu', 'nan_inf')
    """
    if cause in ("hang", "gone"):
        return "hang"
    if cause.startswith("xid") or cause in GPU_CONDITIONS:
        return "gpu"
    return cause


def fault_of(finding: Finding, run: RunContext) -> NodeFault:
    """Classify ``finding`` (module docstring): a hang names the node of its gone ranks, or
    of the ranks stuck elsewhere than the others; a GPU fault, NaN or other finding the
    node of its rank (or the node its evidence names: ``node_rank``)."""
    ev = finding.evidence
    if finding.type == "hang":
        gone = [int(r) for r in ev.get("gone_ranks") or ()]
        found = ev.get("ranks")
        table: dict[Any, Any] = found if isinstance(found, dict) else {}
        frames = [row.get("stuck_in") for row in table.values()
                  if isinstance(row, dict) and row.get("state") == "hung"]
        common = max(set(frames), key=frames.count) if frames else None
        odd = [int(r) for r, row in table.items() if isinstance(row, dict)
               and row.get("state") == "hung" and row.get("stuck_in") != common]
        named = gone or odd
        nodes = {n.node for r in named if (n := run.node_of(r)) is not None}
        node = nodes.pop() if len(nodes) == 1 else None
        # A hang leaves the weights as the last completed step left them.
        return NodeFault("gone" if gone else "hang", node, False, finding.step,
                     finding.step + 1, tuple(named))
    named_node = ev.get("node_rank")
    where = run.node_of(finding.rank)
    node = named_node if isinstance(named_node, int) and not isinstance(named_node, bool) \
        else (where.node if where is not None else None)
    cause = finding.type
    if finding.type == "gpu_health":
        condition = str(ev.get("condition") or "xid")
        cause = f"xid {ev['xid_last']}" if condition == "xid" and ev.get("xid_last") \
            else condition
    hard = finding.type == "gpu_health" and finding.severity >= Severity.CRITICAL
    # A GPU error or a NaN makes what was computed from its onset suspect.
    return NodeFault(cause, node, hard, finding.step, onset_of(finding), (finding.rank,))


def decide(rule: Rule, finding: Finding, run: RunContext, history: Sequence[Past],
           now: float) -> Restart | Stop | Hold:
    """The decision for ``finding`` (module docstring), given the run's earlier healing
    actions (``history``, oldest first)."""
    fault = fault_of(finding, run)
    slow = _slow_phase(finding)
    if slow is not None:
        return Hold(f"no restart: {slow}; a slow evaluation or checkpoint save is not a fault "
                    "to restart for")
    unpaid = _not_paid(rule, finding, fault)
    if unpaid is not None:
        return Hold(unpaid)
    launcher = run.launcher
    if launcher is None or not launcher.restarts:
        said = (f"its launcher ({launcher.name}) does not run it again on exit status 75"
                if launcher is not None else "its ranks did not say they can be restarted "
                "(a client older than the restart action)")
        return Hold(f"no restart: {said}; restart it from its last clean checkpoint by hand")
    window = [p for p in history if p.kind in ("restart", "exclude") and now - p.at
              < rule.restart_window]
    number = len(window) + 1
    if number > rule.restart_budget:
        return Stop(f"restart budget spent ({rule.restart_budget} within "
                    f"{_duration(rule.restart_window)}): stopping; a human must look")
    exclude = _exclusion(rule, fault, finding, run, history, now)
    if isinstance(exclude, Stop):
        return _slow_holds(finding, exclude)
    # A fault back soon after a restart that names no node to leave out: the restart did
    # not cure it (with a node to blame, leaving it out is the next remedy, not a stop).
    cured = None if exclude else _not_cured(rule, fault, finding, history)
    if cured is not None:
        return Stop(cured)
    plan = _plan(rule, fault, run, exclude, number)
    below = _below_minimum(plan, run)
    if below is not None:
        return _slow_holds(finding, Stop(below))
    return Restart(plan, "exclude" if exclude else "restart")


def _not_paid(rule: Rule, finding: Finding, fault: NodeFault) -> str | None:
    """Why an ``exclude`` rule holds on a finding whose node verdict says leaving the node
    out does not pay yet (runs/node_verdict.py: its straggler tax so far is less than one
    restart of this job), on a node not judged sick, or on a soft finding no node verdict
    judged (one slow window of one rank in a one-node run: a single soft signal); None
    otherwise."""
    if rule.action != "exclude":
        return None
    if "node_state" not in finding.evidence:
        if fault.hard:
            return None
        return (f"no exclusion: no node verdict on {finding.type} at step {finding.step}; "
                "one soft signal is not enough to leave a node out")
    words = finding.evidence.get("node_verdict")
    if finding.evidence.get("node_state") != "sick":
        return f"no exclusion: {words}; one soft signal is not enough to leave a node out"
    if finding.evidence.get("node_exclude_pays") is False:
        return f"no exclusion yet: {words}"
    return None


SLOW_CAUSES = frozenset({"compute-slow", "network-slow", "input-slow"})
"""Node verdict causes of a node that works, slowly (runs/node_verdict.py)."""


def _slow_holds(finding: Finding, stop: Stop) -> Stop | Hold:
    """A slow node that cannot be left out (past the exclude budget, or below the job's
    minimum) holds instead of stopping the run: it trains, at the slow node's pace, which
    costs a fraction of what a stopped run does. A straggler is such a node whatever else
    its verdict holds against it (a rank of it dead in an earlier attempt): its ranks train,
    late. A node that fails stops as ``stop`` says."""
    if finding.type != "straggler" and finding.evidence.get("node_cause") not in SLOW_CAUSES:
        return stop
    why = stop.why.removesuffix(": stopping; a human must look")
    return Hold(f"no exclusion: {why}; a slow node costs less than a stopped run: training "
                "on at its pace")


def _slow_phase(finding: Finding) -> str | None:
    """Why a hang is a slow phase rather than a fault: a hung rank in eval or a save."""
    if finding.type != "hang":
        return None
    table = finding.evidence.get("ranks")
    if not isinstance(table, dict):
        return None
    # Evidence keys are JSON object keys (strings): rank "10" comes after rank "2".
    for rank, row in sorted(table.items(), key=lambda kv: _rank_order(kv[0])):
        if isinstance(row, dict) and row.get("state") == "hung" and \
                row.get("phase") in SLOW_PHASES:
            what = "evaluation" if row["phase"] == "eval" else "checkpoint save"
            return f"rank {rank} is in its {what} (phase {row['phase']})"
    return None


def _rank_order(key: object) -> tuple[int, str]:
    text = str(key)
    return (int(text), "") if text.isdigit() else (1 << 62, text)


def _not_cured(rule: Rule, fault: NodeFault, finding: Finding,
               history: Sequence[Past]) -> str | None:
    """Why the last restart did not cure this fault, or None: one of the same kind came back
    within ``restart_cure_steps`` of its resume."""
    last = next((p for p in reversed(history) if p.kind in ("restart", "exclude")), None)
    if last is None or last.plan is None or last.honoured_step is None:
        return None
    if kind_of(last.plan.cause) != fault.kind or \
            finding.step > last.honoured_step + rule.restart_cure_steps:
        return None
    return (f"the restart did not cure it: {fault.cause} again at step {finding.step}, "
            f"{max(finding.step - last.honoured_step, 0)} steps after the restart resumed at "
            f"step {last.honoured_step} (restart_cure_steps {rule.restart_cure_steps}): "
            "stopping; a human must look")


def _exclusion(rule: Rule, fault: NodeFault, finding: Finding, run: RunContext,
               history: Sequence[Past], now: float) -> tuple[ExcludedNode, ...] | Stop:
    """The nodes to leave out (none without node-level evidence), or a Stop past the
    run's budget of excluded nodes."""
    node = next((n for n in run.nodes if n.node == fault.node), None)
    if node is None and fault.node == 0 and not run.nodes:
        node = NodeView(0)  # a run on one node: the leader's own
    if fault.node is None or node is None:
        return ()
    why = None
    if fault.hard:
        why = f"hard GPU error ({fault.cause}) at step {finding.step}"
    if why is None:
        why = repeated(rule, fault, run, history, now)
    if why is None and rule.action == "exclude":
        said = finding.evidence.get("node_verdict")
        why = said if isinstance(said, str) else f"{fault.cause} judged on it"
    if why is None:
        return ()
    left_out = sum(len(p.plan.exclude) for p in history if p.plan is not None)
    budget = rule.exclude_budget if rule.exclude_budget is not None else \
        max(1, math.ceil(_node_count(run) / 10))
    if left_out + 1 > budget:
        return Stop(f"{node.name()} should be left out ({why}), but the run has left "
                    f"{left_out} node{'s' if left_out != 1 else ''} out already "
                    f"(exclude_budget {budget}): stopping; a human must look")
    return (ExcludedNode(node.node, node.host, node.sidecar, node.ranks, why),)


def repeated(rule: Rule, fault: NodeFault, run: RunContext, history: Sequence[Past],
             now: float) -> str | None:
    """Why the fault's node was at fault in an earlier incident within ``restart_window``
    (a restart, exclusion or rollback the run decided), or None; only a run on more than
    one node can tell a node from its data or code this way."""
    if fault.node is None or _node_count(run) < 2:
        return None
    host = _host(run, fault.node)
    earlier = [p for p in history if now - p.at < rule.restart_window
               and _same_node(p, fault.node, host)]
    if not earlier:
        return None
    n = len(earlier) + 1
    said = f"{_cause(earlier[-1])} at step {_step(earlier[-1])}"
    return (f"{n}{_ordinal(n)} incident on it within {_duration(rule.restart_window)} "
            f"({said} and at step {fault.step})")


def _plan(rule: Rule, fault: NodeFault, run: RunContext, exclude: tuple[ExcludedNode, ...],
          number: int) -> RestartPlan:
    """The resume point: the last clean checkpoint before the run's state became suspect."""
    before = [(step, path) for step, path in run.clean_checkpoints
              if step < fault.suspect_from]
    step, path = before[-1] if before else (None, None)
    position = run.checkpoint_positions.get(step) if step is not None else None
    plan = RestartPlan(
        cause=fault.cause, fault_step=fault.step, ranks=max(run.world, 1),
        nodes=_node_count(run), checkpoint_step=step, checkpoint_path=path,
        resume_position=position if position is not None else step,
        skip=tuple(run.skipped),
        positions=run.skipped_unit if run.skipped else (
            "positions" if position is not None else "steps"),
        exclude=exclude, fault_node=fault.node, fault_host=_host(run, fault.node),
        attempt=run.attempt, number=number,
        budget=rule.restart_budget, window_seconds=rule.restart_window)
    return replace(plan, resume_position=None) if step is None else plan


def _below_minimum(plan: RestartPlan, run: RunContext) -> str | None:
    """Why the job cannot run without the nodes left out, or None."""
    if not plan.exclude:
        return None
    launcher = run.launcher
    if launcher is not None and launcher.name in SCHEDULERS:
        return None  # the scheduler finds the job its nodes again, or it waits in the queue
    minimum = launcher.min_nodes if launcher is not None and launcher.min_nodes else \
        plan.nodes
    if plan.left >= minimum:
        return None
    names = ", ".join(n.name() for n in plan.exclude)
    return (f"leaving {names} out leaves {plan.left} node{'s' if plan.left != 1 else ''}, "
            f"below the job's minimum of {minimum}: stopping; a human must look")


def _node_count(run: RunContext) -> int:
    return max(len(run.nodes), 1)


def _host(run: RunContext, node: int | None) -> str | None:
    found = next((n for n in run.nodes if n.node == node), None)
    return found.host if found is not None else None


def _same_node(past: Past, node: int | None, host: str | None) -> bool:
    """Whether ``past`` put its fault on this node: by host when both say one (node
    ranks change when a restart re-forms the job), else by node rank."""
    plan = past.plan
    was_node = plan.fault_node if plan is not None else past.fault_node
    was_host = plan.fault_host if plan is not None else past.fault_host
    if host is not None and was_host is not None:
        return host == was_host
    return was_node is not None and was_node == node


def _cause(past: Past) -> str:
    return past.plan.cause if past.plan is not None else (past.cause or past.kind)


def _step(past: Past) -> int | None:
    return past.plan.fault_step if past.plan is not None else past.fault_step


def _ordinal(n: int) -> str:
    return {1: "st", 2: "nd", 3: "rd"}.get(n if n < 20 else n % 10, "th")


def _duration(seconds: float) -> str:
    if seconds % 3600 == 0:
        return f"{seconds / 3600:.0f} h"
    return f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
