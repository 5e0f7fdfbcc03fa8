"""A step's own time (detectors/support/own_time.py), the one reading ``straggler`` and
``gpu_health`` share: each source of it, in the order it is preferred."""

from __future__ import annotations

import math

import pytest

from monitor_agent.detectors.support.own_time import own_time
from monitor_agent.records.types import StepRecord


@pytest.mark.parametrize(("times", "expected"), [
    ({"compute_time": 0.5, "data_time": 0.2, "step_time": 3.0, "sync_wait_time": 1.0}, 0.7),
    ({"compute_time": 0.5, "data_time": math.nan}, 0.5),  # no data time: compute alone
    ({"step_time": 1.0, "sync_wait_time": 0.25}, 0.75),  # no compute: step less its wait
    ({"step_time": 1.5}, 1.5),  # nothing but the whole step
    ({"step_time": 0.0}, None),  # a whole step of no time says nothing
    ({"step_time": math.inf}, None),
    ({}, None),
])
def test_own_time_prefers_data_and_compute_then_the_step_less_its_wait(times, expected):
    rec = StepRecord(run_id="r", step=1, time=1.0, **times)
    assert own_time(rec) == (pytest.approx(expected) if expected is not None else None)
