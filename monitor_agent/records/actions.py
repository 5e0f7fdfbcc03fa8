"""An action a rule took for a run, its plan and the decisions that make one: one typed
contract, from the decision (alerting/) to the wire (api/) and back (a node sidecar adopting
its leader's actions, the alert database).

A rule's action (alerting/rule_actions.py) is one of ``ACTIONS``. Its ``plan`` is typed by
the action: a ``rollback`` carries a ``RollbackSpec`` (records/rollback_plan.py), a
``restart`` or ``exclude`` a ``RestartPlan`` (records/restart_plan.py), the others none. A
decision (alerting/rollback.py, alerting/restart.py ``decide``) is a ``RollbackDecision``, a
``Restart``, a ``Stop`` (a human must look, and why) or a ``Hold`` (no action, and why).

The JSON of an action (``Action.to_dict``: the ingest answer's ``actions``, ``GET
/v1/runs/{id}/actions``, the peer link) is read back by ``Action.parse`` and its plan by
``plan_of``, the one parser: a plan that does not parse is not acted on.
docs/action.schema.json states the shape (generated from these types: ``python -m
monitor_agent.records.actions``); tests/records/test_action_schema.py checks the sidecar's
decisions and the client's readers (client/monitor_client/_rollback.py, _restart.py)
against it.

    >>> plan = RollbackSpec(checkpoint_step=10, checkpoint_path="/c/10.pt", skip_from=11,
    ...                     skip_to=30, skip=((11, 30),), resume_position=10,
    ...                     positions="positions")
    >>> action = Action(id=1, run_id="r", action="rollback", rule="R", type="nan_inf",
    ...                 step=21, message=plan.describe(), created_at=5.0, plan=plan)
    >>> Action.parse(action.to_dict()) == action
    True
    >>> plan_of("stop", None), plan_of("rollback", {"checkpoint_step": 10}) is None
    (None, True)
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from monitor_agent.records.restart_plan import CAUSE_MAX, ExcludedNode, RestartPlan
from monitor_agent.records.rollback_plan import RollbackSpec

__all__ = ["ACTIONS", "CAUSE_MAX", "SCHEMA_PATH", "Action", "Decision", "ExcludedNode", "Hold",
           "Plan", "RESTART_ACTIONS", "RestartPlan", "Restart", "RollbackDecision", "RollbackSpec",
           "Stop", "action_schema", "plan_of"]

RESTART_ACTIONS: tuple[str, ...] = ("restart", "exclude")
"""The actions whose plan is a ``RestartPlan``: every rank leaves with the restart exit."""
ACTIONS: tuple[str, ...] = ("stop", "checkpoint", "rollback", *RESTART_ACTIONS)
"""Actions the trainer is asked to take; ``notify-only`` (a rule's default) takes none."""

Plan = RollbackSpec | RestartPlan


def plan_of(action: str, data: Any) -> Plan | None:
    """The typed plan of an ``action``'s ``plan`` JSON: None for an action that has none,
    and for a plan that is not a whole one (the caller says which it expected)."""
    if action == "rollback":
        return RollbackSpec.from_dict(data)
    if action in RESTART_ACTIONS:
        return RestartPlan.from_dict(data)
    return None


@dataclass(frozen=True, slots=True)
class Action:
    """One action a rule took for a run; ``id`` orders a run's actions (poll with after=id).

    See ``alerting/rule_actions.py`` for when rules act and how a stop request is honoured.
    """

    id: int
    run_id: str
    action: str = field(metadata={"description": "stop, checkpoint, rollback, restart or "
                                                 "exclude."})
    rule: str
    type: str
    step: int = field(metadata={"description": "Step of the finding that triggered it."})
    message: str
    created_at: float
    honoured_step: int | None = field(default=None, metadata={"description": (
        "stop: the step the trainer stopped at; rollback: the step the run resumed at; "
        "restart, exclude: the step the relaunched job resumed at.")})
    plan: RollbackSpec | RestartPlan | None = field(default=None, metadata={"description": (
        "rollback: a RollbackSpec (records/rollback_plan.py); restart, exclude: a "
        "RestartPlan (records/restart_plan.py); null for other actions.")})
    withdrawn_by: int | None = field(default=None, metadata={"description": (
        "rollback: the id of the plan that replaced this one before it was applied (its "
        "checkpoint turned suspect); null otherwise. A withdrawn plan is not an order.")})

    @property
    def rollback(self) -> RollbackSpec | None:
        """The plan, when it is a rollback's."""
        return self.plan if isinstance(self.plan, RollbackSpec) else None

    @property
    def restart(self) -> RestartPlan | None:
        """The plan, when it is a restart's or an exclusion's."""
        return self.plan if isinstance(self.plan, RestartPlan) else None

    def to_dict(self) -> dict[str, Any]:
        """The action's JSON (the wire's key order)."""
        return {"id": self.id, "run_id": self.run_id, "action": self.action,
                "rule": self.rule, "type": self.type, "step": self.step,
                "message": self.message, "created_at": self.created_at,
                "honoured_step": self.honoured_step,
                "plan": None if self.plan is None else self.plan.to_dict(),
                "withdrawn_by": self.withdrawn_by}

    @classmethod
    def parse(cls, data: Mapping[str, Any], run_id: str | None = None) -> Action:
        """An action back from its JSON (``run_id``: the run it is known to be of);
        ValueError, KeyError or TypeError for one that is not whole, its plan included."""
        kind = str(data["action"])
        plan = plan_of(kind, data.get("plan"))
        if (plan is None) != (kind not in ("rollback", *RESTART_ACTIONS)):
            raise ValueError(f"{kind}: plan {'missing or not whole' if plan is None else 'unexpected'}")
        honoured, withdrawn = data.get("honoured_step"), data.get("withdrawn_by")
        return cls(id=int(data["id"]), run_id=run_id or str(data.get("run_id") or ""),
                   action=kind, rule=str(data.get("rule") or ""),
                   type=str(data.get("type") or ""), step=int(data.get("step") or 0),
                   message=str(data.get("message") or ""),
                   created_at=float(data.get("created_at") or 0.0),
                   honoured_step=None if honoured is None else int(honoured), plan=plan,
                   withdrawn_by=None if withdrawn is None else int(withdrawn))


@dataclass(frozen=True, slots=True)
class RollbackDecision:
    """Decided: go back to the plan's checkpoint, skipping its windows."""

    plan: RollbackSpec
    kind: str = "rollback"


@dataclass(frozen=True, slots=True)
class Restart:
    """Decided: every rank leaves and the launcher runs the job again from the plan."""

    plan: RestartPlan
    kind: str = "restart"  # "exclude" when the plan leaves nodes out


@dataclass(frozen=True, slots=True)
class Stop:
    """Decided: the run cannot be healed safely; a human must look (``why``)."""

    why: str


@dataclass(frozen=True, slots=True)
class Hold:
    """No action, and why (noted on the alert)."""

    why: str


Decision = RollbackDecision | Restart | Stop | Hold

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "docs" / "action.schema.json"


def action_schema() -> dict[str, Any]:
    """The JSON Schema of an action as the sidecar serves it (the ingest answer's
    ``actions``, ``GET /v1/runs/{id}/actions``), its plans from the types above."""
    from pydantic import TypeAdapter

    defs: dict[str, Any] = {}
    for plan_type in (RollbackSpec, RestartPlan):
        schema = TypeAdapter(plan_type).json_schema(mode="serialization")
        defs.update(schema.pop("$defs", {}))
        defs[plan_type.__name__] = schema
    number = {"type": "number"}
    optional_int = {"anyOf": [{"type": "integer"}, {"type": "null"}]}
    ref = {"rollback": {"$ref": "#/$defs/RollbackSpec"},
           "restart": {"$ref": "#/$defs/RestartPlan"}}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "monitor-agent/action/v1",
        "title": "monitor-agent action",
        "description": "See docs/actions.md. Generated by `python -m "
                       "monitor_agent.records.actions`; do not edit.",
        "type": "object",
        "required": ["id", "action", "plan", "created_at"],
        "properties": {
            "id": {"type": "integer", "minimum": 1},
            "run_id": {"type": "string"},
            "action": {"enum": list(ACTIONS)},
            "rule": {"type": "string"}, "type": {"type": "string"},
            "step": {"type": "integer"}, "message": {"type": "string"},
            "created_at": number, "honoured_step": optional_int,
            "withdrawn_by": optional_int,
            "plan": {"anyOf": [ref["rollback"], ref["restart"], {"type": "null"}]}},
        "allOf": [
            {"if": {"properties": {"action": {"const": "rollback"}}},
             "then": {"properties": {"plan": ref["rollback"]}}},
            {"if": {"properties": {"action": {"enum": list(RESTART_ACTIONS)}}},
             "then": {"properties": {"plan": ref["restart"]}}},
            {"if": {"properties": {"action": {"enum": ["stop", "checkpoint"]}}},
             "then": {"properties": {"plan": {"type": "null"}}}}],
        "$defs": defs,
    }


if __name__ == "__main__":
    SCHEMA_PATH.write_text(json.dumps(action_schema(), indent=2, sort_keys=True) + "\n")
    print(f"wrote {SCHEMA_PATH}", file=sys.stderr)
