"""bench/guard_precision.py, the step guard judged on precision (issue 31): replayed through
the guard's own decision, the public healthy traces lose no step, while a corrupt batch of
one of its own runs through the real client is still skipped. (The bench prints the rate
over every recorded healthy step: 0.33 per 10,000.)"""

from __future__ import annotations

from bench import guard_precision
from monitor_client.settings import GuardSettings


def test_the_public_healthy_traces_lose_no_step_to_the_guard():
    healthy = [(name, norms) for name, norms in guard_precision.healthy_norms()
               if name.startswith("public/")]
    assert sum(len(n) for _, n in healthy) > 5000
    skipped = {name: guard_precision.replay(norms, GuardSettings()) for name, norms in healthy}
    assert not any(skipped.values()), skipped  # (the band it replaced skipped 39 of them)


def test_a_corrupt_batch_of_a_healthy_run_is_still_skipped():
    assert guard_precision.own_run("mlp_adamw_fused", 160, seed=3, spikes=(120,)) == [120]
