"""Where a straggler's extra time goes (detectors/support/extra_time.py): split on sums or
means, its parts add up to the others' wait for it."""

from __future__ import annotations

import math

import numpy as np

from monitor_agent.detectors.support.extra_time import largest, split_extra


def test_the_parts_of_window_means_add_up_to_the_wait_they_cause():
    """Under synchronous DP the others' wait less the straggler's is how much later it
    arrived, step by step: split on the window's means, its extra data, extra compute and
    extra time outside both are each recovered, whatever the noise of each part."""
    rng = np.random.default_rng(7)
    steps = 20
    theirs = {"data": rng.normal(0.01, 0.0005, steps), "compute": rng.normal(0.1, 0.01, steps),
              "outside": rng.exponential(0.01, steps)}
    mine = {"data": theirs["data"] + rng.exponential(0.3, steps),
            "compute": theirs["compute"] + rng.exponential(0.02, steps),
            "outside": theirs["outside"] + rng.exponential(0.05, steps)}
    arrive_mine = sum(mine.values())
    arrive_theirs = sum(theirs.values())
    late = float(np.mean(arrive_mine - arrive_theirs))  # their wait less its own
    parts = split_extra(late, float(np.mean(mine["data"] - theirs["data"])),
                        float(np.mean(mine["compute"] - theirs["compute"])))
    assert math.isclose(sum(parts.values()), late)
    for part, key in (("data", "data"), ("compute", "compute"), ("collective", "outside")):
        assert math.isclose(parts[part], float(np.mean(mine[key] - theirs[key])))
    assert largest(parts) == "data"


def test_own_work_beyond_the_wait_is_shared_and_no_wait_keeps_its_own_extras():
    assert split_extra(0.1, 0.3, 0.1) == {"compute": 0.1 * 0.1 / 0.4, "data": 0.1 * 0.3 / 0.4,
                                          "collective": 0.0}
    for late in (math.nan, 0.0, -0.05):  # no all-reduce timed, or nobody waits for it
        assert split_extra(late, 0.2, 0.05) == {"compute": 0.05, "data": 0.2, "collective": 0.0}
    # a part it is faster in is no part of its extra time; an unsaid part is none
    assert split_extra(0.2, -0.05, math.nan) == {"compute": 0.0, "data": 0.0,
                                                  "collective": 0.2}


def test_ties_name_its_own_compute_then_its_data_before_the_unmeasured():
    assert largest({"compute": 0.1, "data": 0.1, "collective": 0.1}) == "compute"
    assert largest({"compute": 0.0, "data": 0.1, "collective": 0.1}) == "data"
    assert largest({"compute": 0.0, "data": 0.0, "collective": 0.0}) == "compute"
