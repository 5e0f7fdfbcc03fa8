"""docs/action.schema.json, checked from both sides: it is what the action's and plans'
types generate; every action the sidecar decides (a rollback, a stop, a restart or an
exclusion) validates against it; and the client reads no field of an action or plan that
the schema does not declare, and acts on one that has only the fields the schema
requires."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jsonschema

from monitor_agent.alerting import rollback
from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.alerting.restart import Restart, decide
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import (
    SCHEMA_PATH,
    Action,
    RollbackDecision,
    Stop,
    action_schema,
)
from monitor_agent.records.types import Finding, LauncherDeclaration, Severity
from monitor_client._restart import RestartOrder, resume_plan_of
from monitor_client._rollback import RollbackPlan

CLIENT_DIR = Path(__file__).resolve().parents[2] / "client" / "monitor_client"
CLIENT = CLIENT_DIR / "_restart.py"
RULE = Rule(name="Heal", types=("hang", "gpu_health"), channels=("console",), cooldown=60,
            repeat_interval=3600, resolve_after=600, action="restart")
RUN = RunContext("job", clean_checkpoints=((100, "/c/100.pt"),), checkpoint_positions={100: 7},
                 world=4, nodes=(NodeView(0, "n0", None, (0, 1)), NodeView(1, "n1", "s1", (2, 3))),
                 launcher=LauncherDeclaration("torchrun", True, 0, 3, min_nodes=1),
                 skipped=((3, 5),))


def test_the_checked_in_schema_is_what_the_types_generate():
    assert json.loads(SCHEMA_PATH.read_text()) == action_schema(), (
        "docs/action.schema.json is stale: python -m monitor_agent.records.actions")


def test_every_decision_validates_against_the_schema():
    hang = Finding("hang", Severity.CRITICAL, "job", step=120, rank=0, message="hung",
                   evidence={"hung_ranks": [0, 1, 2, 3], "gone_ranks": [], "ranks": {}})
    xid = Finding("gpu_health", Severity.CRITICAL, "job", step=120, rank=3, message="xid",
                  evidence={"condition": "xid", "xid_last": 79})
    for finding in (hang, xid):
        decision = decide(RULE, finding, RUN, (), now=0.0)
        assert isinstance(decision, Restart)
        action = {"id": 3, "run_id": "job", "action": decision.kind, "rule": "Heal",
                  "type": finding.type, "step": 120, "message": decision.plan.describe(),
                  "created_at": 1.0, "honoured_step": None, "withdrawn_by": None,
                  "plan": decision.plan.to_dict()}
        jsonschema.validate(action, action_schema())


def _plan_keys_read_by_the_client(module: Path = CLIENT) -> set[str]:
    """The string keys the client module reads with ``.get("...")`` or ``["..."]``."""
    keys = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "get" and \
                node.args and isinstance(node.args[0], ast.Constant):
            keys.add(node.args[0].value)
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            keys.add(node.slice.value)
    return {k for k in keys if isinstance(k, str)}


def test_the_client_reads_only_declared_fields_and_acts_on_the_required_ones():
    schema = action_schema()
    declared = set(schema["properties"]) | set(schema["$defs"]["RestartPlan"]["properties"]) \
        | set(schema["$defs"]["ExcludedNode"]["properties"])
    assert _plan_keys_read_by_the_client() <= declared
    required = {k: v for k, v in {
        "id": 4, "action": "restart", "created_at": 10.0,
        "plan": {"cause": "hang", "fault_step": 9, "ranks": 2}}.items()}
    jsonschema.validate(required, schema)
    left = []
    order = RestartOrder(started=1.0, enabled=True, node_rank=0, flush=lambda t: True,
                         timeout=0.0, exit=left.append, threaded=False)
    order.receive(required)
    assert left == [75]
    with_checkpoint = {**required, "plan": {**required["plan"], "checkpoint_step": 8,
                                            "checkpoint_path": "/c/8.pt"}}
    jsonschema.validate(with_checkpoint, schema)
    plan = resume_plan_of(with_checkpoint)
    assert plan is not None and (plan.checkpoint_step, plan.resume_position) == (8, 8)


ROLLBACK = Rule(name="RollBack", types=("nan_inf",), channels=("console",), cooldown=60,
                repeat_interval=3600, resolve_after=600, action="rollback",
                rollback_lr_factor=0.5, rollback_lr_steps=20, rollback_budget=2)


def _decided(number: int, data: rollback.Positions | None, clean=((100, "/c/100.pt"),)
             ) -> dict:
    """The action the sidecar serves for a rollback rule's decision, as its JSON."""
    fault = Finding("nan_inf", Severity.CRITICAL, "job", step=120, message="NaN")
    decision = rollback.decide(ROLLBACK, fault, clean, number, data)
    if isinstance(decision, Stop):
        return Action(id=number, run_id="job", action="stop", rule="RollBack",
                      type="nan_inf", step=120, message=decision.why,
                      created_at=1.0).to_dict()
    assert isinstance(decision, RollbackDecision)
    return Action(id=number, run_id="job", action="rollback", rule="RollBack",
                  type="nan_inf", step=120, message=decision.plan.describe(),
                  created_at=1.0, plan=decision.plan).to_dict()


def test_every_rollback_and_stop_validates_against_the_schema():
    positions = rollback.Positions(checkpoints={100: 7}, latest={0: (120, 30, 1)},
                                   skipped=((3, 5),), skips_by="reading")
    in_steps = _decided(1, None)
    in_positions = _decided(2, positions)
    stop = _decided(3, positions)  # past the budget of 2
    assert (in_steps["action"], in_positions["action"], stop["action"]) == (
        "rollback", "rollback", "stop")
    assert "skips_by" in in_positions["plan"] and "skips_by" not in in_steps["plan"]
    schema = action_schema()
    for action in (in_steps, in_positions, stop):
        jsonschema.validate(action, schema)
    # And the schema says which plan goes with which action.
    for wrong in ({**stop, "plan": in_steps["plan"]}, {**in_steps, "plan": None},
                  {**in_steps, "plan": {"checkpoint_step": 100}}):
        assert not jsonschema.Draft202012Validator(schema).is_valid(wrong), wrong


def test_the_client_reads_only_declared_rollback_fields_and_acts_on_the_required_ones():
    schema = action_schema()
    declared = set(schema["properties"]) | set(schema["$defs"]["RollbackSpec"]["properties"])
    for module in ("_rollback.py", "_actions.py"):
        read = _plan_keys_read_by_the_client(CLIENT_DIR / module)
        assert read <= declared, (module, read - declared)
    required = {"id": 5, "action": "rollback", "created_at": 10.0, "plan": {
        k: v for k, v in {"checkpoint_step": 100, "checkpoint_path": "/c/100.pt",
                          "skip_from": 101, "skip_to": 130}.items()
        if k in schema["$defs"]["RollbackSpec"]["required"]}}
    jsonschema.validate(required, schema)
    plan = RollbackPlan.from_action(required)
    assert plan is not None and (plan.resume_step, plan.skip) == (101, ((101, 130),))
    # What the sidecar decides, the client takes whole.
    decided = _decided(2, rollback.Positions(checkpoints={100: 7}, latest={0: (120, 30, 1)}))
    plan = RollbackPlan.from_action(decided)
    assert plan is not None and (plan.resume_position, plan.skip) == (7, ((8, 230),))
