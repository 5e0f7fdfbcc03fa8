"""bench/guard_precision.py, the step guard judged on precision (issue 31): replayed through
the guard's own decision, the public healthy traces lose no step, while a corrupt batch of
one of its own runs through the real client is still skipped. (The bench prints the rate
over every recorded healthy step: 0.33 per 10,000.)"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from monitor_client.settings import GuardSettings

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    if "guard_precision" in sys.modules:
        return sys.modules["guard_precision"]
    spec = importlib.util.spec_from_file_location("guard_precision",
                                                  ROOT / "bench" / "guard_precision.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["guard_precision"] = module
    spec.loader.exec_module(module)
    return module


def test_the_public_healthy_traces_lose_no_step_to_the_guard():
    bench = _bench()
    healthy = [(name, norms) for name, norms in bench.healthy_norms()
               if name.startswith("public/")]
    assert sum(len(n) for _, n in healthy) > 5000
    skipped = {name: bench.replay(norms, GuardSettings()) for name, norms in healthy}
    assert not any(skipped.values()), skipped  # (the band it replaced skipped 39 of them)


def test_a_corrupt_batch_of_a_healthy_run_is_still_skipped():
    assert _bench().own_run("mlp_adamw_fused", 160, seed=3, spikes=(120,)) == [120]
