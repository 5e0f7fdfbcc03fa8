"""The restart plan's one parser (records/restart_plan.py): whole plans round-trip, plans with
holes or absurd values are no plans."""

from __future__ import annotations

import pytest

from monitor_agent.records.actions import ExcludedNode, RestartPlan

WHOLE = RestartPlan(cause="xid 79", fault_step=412, ranks=16, nodes=4, checkpoint_step=400,
                    checkpoint_path="/ckpt/400.pt", resume_position=420,
                    skip=((101, 130),), exclude=(ExcludedNode(2, "gpu-node-2", "ab12",
                                                              (8, 9, 10, 11), "hard GPU error"),),
                    fault_node=2, fault_host="gpu-node-2", attempt=3, number=2, budget=3)


def test_a_whole_plan_round_trips_through_its_json_form():
    assert RestartPlan.from_dict(WHOLE.to_dict()) == WHOLE
    assert WHOLE.left == 3 and WHOLE.resume_step == 401


@pytest.mark.parametrize("change", [
    {"ranks": 0}, {"cause": ""}, {"cause": "x" * 65}, {"fault_step": -1},
    {"fault_step": 2**64}, {"fault_step": True}, {"checkpoint_path": None},
    {"checkpoint_step": None}, {"skip": [[5, 3]]}, {"skip": [[1]]}, {"skip": "1-3"},
    {"window_seconds": float("nan")}, {"window_seconds": 0},
    {"exclude": [{"node": "one"}]}, {"exclude": [{"node": 1, "host": "a\nb"}]},
    {"checkpoint_path": "x" * 5000},
])
def test_a_plan_with_a_hole_or_an_absurd_value_is_no_plan(change):
    assert RestartPlan.from_dict({**WHOLE.to_dict(), **change}) is None


def test_a_plan_without_a_checkpoint_starts_over():
    plan = RestartPlan.from_dict({**WHOLE.to_dict(), "checkpoint_step": None,
                                  "checkpoint_path": None, "resume_position": None})
    assert plan is not None and plan.resume_step == 1
    assert "from the start (no clean checkpoint" in plan.describe()
