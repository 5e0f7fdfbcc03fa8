"""``action_held``: the job's action (a rollback plan, a stop) was held back because not
every rank could take it together.

The run's leader decides an action once for every rank, and every rank takes it at the same
agreed call or none does (client/monitor_client/_agreement.py): a rank that cannot get the
action from its sidecar, or that holds another content under the same id, holds the whole
job back and says so with an ``agreement`` record. Nothing deadlocks and the job keeps
training, but the decision is not carried out: a rollback that does not happen lets the run
go on from a fault it was meant to leave, and a stop that does not happen keeps burning
GPU hours. That is worth a page, once per action and outcome, naming the ranks and why.

A cross-rank finding (``scope = "run"``): in a multi-node run the leader, which decided the
action, makes it from every node's ranks.

Rank 3's sidecar never got rollback plan 2; the job held it back at two agreed calls::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> def held(rounds, step):
    ...     return parse_record({"kind": "agreement", "run_id": "r", "rank": 3, "step": step,
    ...         "time": float(step), "action_id": 2, "action": "rollback", "outcome": "missing",
    ...         "rounds": rounds, "check_every": 10,
    ...         "detail": "this rank's sidecar does not have it (ConnectError)"})
    >>> print(suite.update(held(1, 130))[0].message)
    rollback 2 held back at step 130: rank 3 lacks it (this rank's sidecar does not have it
    (ConnectError)); no rank acts until every rank has it, the job keeps training and looks
    again every 10 steps
    >>> suite.update(held(2, 140))   # the same hold, told once
    []
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.records.types import AgreementRecord, Finding, Record, Severity

ACTION_HELD = (
    "Check the named ranks' node sidecars: /readyz, and that they reach the run's leader "
    "(monitor_agent_leader_exchanges_total{outcome='failed'} on /metrics).",
    "A 'mismatch' means two sidecars decided for the run: check that every node's sidecar "
    "follows the same leader (cluster.leader_url, MASTER_ADDR).",
    "Nothing is lost meanwhile: the job trains on; act by hand (stop it, or relaunch from "
    "the plan's checkpoint) if the hold lasts.",
    "An 'unreported' plan names a checkpoint that no process of the job reported with "
    "checkpoint_saved(): check who else writes to this run id (GET /v1/runs/{id}/checkpoints).",
)


@dataclass(slots=True)
class HeldState:
    told: list[str] = field(default_factory=list)  # "<action>/<id>/<outcome>" already paged


class ActionHeldDetector(DetectorBase[SharedSettings]):
    """Error when ranks hold the job's action back (see module docstring)."""

    type = "action_held"
    severity = Severity.ERROR
    settings_model = SharedSettings
    scope = "run"

    def __init__(self, settings: SharedSettings, ctx: Any) -> None:
        super().__init__(settings, ctx)
        self.state = HeldState()

    def update(self, record: Record) -> list[Finding]:
        if not isinstance(record, AgreementRecord):
            return []
        key = f"{record.action}/{record.action_id}/{record.outcome}"
        if key in self.state.told:
            return []
        self.state.told = [*self.state.told[-63:], key]
        lacks = {"missing": "lacks it",
                 "unreported": "refuses it: no rank of the job reported the checkpoint it "
                               "names"}.get(record.outcome, "holds another content under its id")
        why = f" ({record.detail})" if record.detail else ""
        every = f" every {record.check_every} steps" if record.check_every else ""
        then = (f"no rank acts until every rank has it, the job keeps training and looks "
                f"again{every}")
        if record.outcome == "unreported":  # never loaded: training on keeps the fault
            then = "no rank loads it, and the job stops rather than train on from the fault"
        message = (f"{record.action} {record.action_id} held back at step {record.step}: "
                   f"rank {record.rank} {lacks}{why}; {then}")
        return [Finding(type=self.type, severity=self.severity, run_id=record.run_id,
                        step=record.step, rank=record.rank, message=message,
                        value=float(record.rounds), time=record.time,
                        evidence={"action": record.action, "action_id": record.action_id,
                                  "outcome": record.outcome, "rounds": record.rounds,
                                  "detail": record.detail},
                        suggestions=ACTION_HELD)]

    def snapshot_extra(self) -> dict[str, Any]:
        return {"told": list(self.state.told)}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self.state = HeldState(told=[str(k) for k in data.get("told") or []])
