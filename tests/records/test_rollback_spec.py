"""The rollback plan's one parser (records/rollback_plan.py): every plan a rule decides
round-trips through its JSON unchanged, byte for byte (a node sidecar serves its leader's
plan as it parsed it, and every rank must hold the same content); plans with holes or
absurd values are no plans, saying which field."""

from __future__ import annotations

import json

import pytest

from monitor_agent.alerting import rollback
from monitor_agent.alerting.rules import Rule
from monitor_agent.records.actions import RollbackDecision
from monitor_agent.records.rollback_plan import PlanError, RollbackSpec
from monitor_agent.records.types import Finding, Severity


def _rule(factor: float | None) -> Rule:
    return Rule(name="R", types=("divergence",), channels=("console",), cooldown=60,
                repeat_interval=3600, resolve_after=600, action="rollback",
                rollback_lr_factor=factor, rollback_lr_steps=50, rollback_skip_margin=7)


FAULT = Finding("divergence", Severity.ERROR, "r", step=120, message="",
                evidence={"onset_step": 110})
CLEAN = ((50, "/c/50.pt"), (100, "/c/100.pt"))
SHAPES = [
    None,  # no data positions: counted in steps
    rollback.Positions(checkpoints={100: 130}, latest={0: (120, 160, 2)}),
    rollback.Positions(checkpoints={100: 130}, latest={0: (120, 160, 2)},
                       skipped=((20, 30), (101, 104)), skips_by="sampler"),
    rollback.Positions(checkpoints={100: 130}, latest={0: (120, 160, 2)}, skipped=((3, 9),),
                       skipped_unit="steps", skips_by="reading"),
]


@pytest.mark.parametrize("factor", [None, 0.5])
@pytest.mark.parametrize("data", SHAPES)
def test_every_decided_plan_round_trips_byte_for_byte(data, factor):
    decision = rollback.decide(_rule(factor), FAULT, CLEAN, number=1, data=data)
    assert isinstance(decision, RollbackDecision)
    for plan in (decision.plan, RollbackSpec(**{**_fields(decision.plan), "fault_node": 1}),
                 RollbackSpec(**{**_fields(decision.plan), "fault_node": 1,
                                 "fault_host": "gpu-node-1"})):
        wire = json.dumps(plan.to_dict())
        again = RollbackSpec.parse(json.loads(wire))
        assert again == plan and json.dumps(again.to_dict()) == wire


def _fields(plan: RollbackSpec) -> dict:
    return {name: getattr(plan, name) for name in RollbackSpec.__dataclass_fields__}


WHOLE = {"checkpoint_step": 100, "checkpoint_path": "/c/100.pt", "resume_position": 130,
         "skip": [[131, 174]], "positions": "positions", "skip_from": 101, "skip_to": 127,
         "lr_factor": 0.5, "lr_steps": 50, "number": 1, "budget": 2}


@pytest.mark.parametrize(("change", "field"), [
    ({"checkpoint_step": None}, "checkpoint_step"), ({"skip_from": -1}, "skip_from"),
    ({"skip_to": 2**60}, "skip_to"), ({"number": True}, "number"),
    ({"checkpoint_path": ""}, "checkpoint_path"), ({"checkpoint_path": "x" * 5000},
                                                   "checkpoint_path"),
    ({"skip_from": 100}, "skip_from"), ({"skip": [[5, 3]]}, "skip"), ({"skip": [[1]]}, "skip"),
    ({"skip": "1-3"}, "skip"), ({"skip": [[1, 2]] * 10_001}, "skip"),
    ({"positions": "batches"}, "positions"), ({"lr_factor": float("nan")}, "lr_factor"),
    ({"lr_factor": 1.5}, "lr_factor"), ({"lr_steps": 0}, "lr_steps"),
    ({"skips_by": "a\nb"}, "skips_by"), ({"fault_node": "one"}, "fault_node"),
])
def test_a_plan_with_a_hole_or_an_absurd_value_is_no_plan(change, field):
    assert RollbackSpec.from_dict(WHOLE) is not None
    with pytest.raises(PlanError, match=f"^{field}: "):
        RollbackSpec.parse({**WHOLE, **change})
    assert RollbackSpec.from_dict({**WHOLE, **change}) is None
    assert RollbackSpec.from_dict([WHOLE]) is None
