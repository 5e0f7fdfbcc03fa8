"""The step front: the live ranks' slowest and newest steps, as a pass over every rank
would give them, whatever the order of steps and ends."""

from __future__ import annotations

import numpy as np

from monitor_agent.detectors.support.front import STALE_STEPS, StepFront


def test_the_front_is_what_a_pass_over_every_rank_gives():
    rng = np.random.default_rng(0)
    front, steps = StepFront(), {}
    for _ in range(20_000):
        rank = int(rng.integers(0, 40))
        if rng.random() < 0.02:
            front.left(rank)
            steps.pop(rank, None)
        else:
            step = steps.get(rank, 0) + int(rng.integers(-1, 4))  # a restart goes back
            front.saw(rank, step)
            steps[rank] = step
        assert front.slowest == min(steps.values(), default=-1)
        assert front.newest == max(steps.values(), default=-1)
        assert max(len(front._low), len(front._high)) <= 2 * len(front) + 33 + 1


def test_a_rank_that_never_sends_a_step_holds_it_back_only_so_far():
    front = StepFront()
    front.saw(0, 10)
    front.saw(1, 10 + STALE_STEPS)
    assert not front.complete(11) and front.complete(10)
    front.saw(1, 11 + STALE_STEPS)
    assert front.complete(11) and front.judged_through() == 11
