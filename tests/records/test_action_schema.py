"""docs/action.schema.json, checked from both sides: it is what the plan's types generate;
every restart or exclusion the sidecar decides validates against it; and the client reads
no field of a plan that the schema does not declare, and acts on a plan that has only the
fields the schema requires."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import jsonschema

from monitor_agent.alerting.alerts import NodeView, RunContext
from monitor_agent.alerting.restart import Restart, decide
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import SCHEMA_PATH, action_schema
from monitor_agent.records.types import Finding, LauncherDeclaration, Severity
from monitor_client._restart import RestartOrder, resume_plan_of

CLIENT = Path(__file__).resolve().parents[2] / "client" / "monitor_client" / "_restart.py"
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


def _plan_keys_read_by_the_client() -> set[str]:
    """The string keys the client module reads with ``.get("...")`` or ``["..."]``."""
    keys = set()
    for node in ast.walk(ast.parse(CLIENT.read_text())):
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
