"""window_trained: after a rollback the resumed run's data positions are checked against
the plan's windows. A run that jumped over them is left alone, whatever it consumes per
step; one that trains inside one is an error once per plan and rank, then a summary of
every position it trained there; a plan counted in steps cannot be checked."""

from __future__ import annotations

from monitor_agent.detectors import DetectorSettings, DetectorSuite
from monitor_agent.detectors.support.context import SkipPlan
from monitor_agent.records.schemas import parse_record


def _step(s: int, pos: int, rank: int = 0):
    return parse_record({"kind": "step", "run_id": "r", "step": s, "time": float(s),
                         "rank": rank, "loss": 2.0, "data_position": pos})


def _found(suite: DetectorSuite, records) -> list:
    return [f for rec in records for f in suite.update(rec) if f.type == "window_trained"]


def _resumed(per_step: int, plan: SkipPlan, first_position: int, ranks=(0,)) -> list:
    """Steps 1-100 at ``per_step`` positions a step, then the plan applied at 101 and the
    resumed steps 101-140 starting at ``first_position``."""
    suite = DetectorSuite(DetectorSettings())
    _found(suite, [_step(s, s * per_step, r) for s in range(1, 101) for r in ranks])
    suite.ctx.skip_plan = plan
    return _found(suite, [_step(s, first_position + (s - 101) * per_step, r)
                          for s in range(101, 141) for r in ranks])


def test_a_run_that_jumped_over_the_window_is_left_alone():
    # Four batches a step (gradient accumulation): checkpoint at step 100 = batch 400,
    # windows from an earlier rollback and this one; the resumed step 101 ends at batch 504.
    plan = SkipPlan(2, ((121, 150), (401, 500)), 400, 101, "positions")
    assert _resumed(4, plan, first_position=504) == []


def test_one_that_trains_the_window_is_told_once_per_rank_then_summed_up():
    plan = SkipPlan(1, ((101, 130),), 100, 101, "positions")
    found = _resumed(1, plan, first_position=101, ranks=(0, 1))
    assert [(f.step, f.rank) for f in found] == [(101, 0), (101, 1), (131, 0), (131, 1)]
    assert found[0].evidence["positions"] == [[101, 101]]
    assert found[2].evidence["positions"] == [[101, 130]]
    assert "steps 101-130 trained batches 101-130" in found[2].message


def test_a_plan_counted_in_steps_is_not_checked():
    plan = SkipPlan(1, ((101, 130),), None, 101, "steps")
    assert _resumed(1, plan, first_position=101) == []


def test_what_it_told_survives_a_snapshot_and_restore():
    plan = SkipPlan(1, ((101, 130),), 100, 101, "positions")
    suite = DetectorSuite(DetectorSettings())
    _found(suite, [_step(s, s) for s in range(1, 101)])
    suite.ctx.skip_plan = plan
    assert len(_found(suite, [_step(s, s) for s in range(101, 111)])) == 1
    restored = DetectorSuite(DetectorSettings())
    restored.restore(suite.snapshot())
    restored.ctx.skip_plan = plan  # the engine sets it from the run's lifecycle on load
    later = _found(restored, [_step(s, s) for s in range(111, 141)])
    assert [f.step for f in later] == [131] and later[0].evidence["positions"] == [[101, 130]]
