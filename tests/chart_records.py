"""The records of a plain run for chart-history tests: a run record with its schedule and
layer order, then ``n`` steps of constant values, any of them overridden."""

from __future__ import annotations


def steps(n: int, over: dict[int, dict] | None = None) -> list[dict]:
    """Run ``r``'s records: the run, then steps 1..n; ``over[s]`` updates step ``s``."""
    out = [{"kind": "run", "run_id": "r", "config": {"warmup_steps": 10, "total_steps": n},
            "model": {"layer_order": ["b", "a"]}}]
    for s in range(1, n + 1):
        rec = {"kind": "step", "run_id": "r", "step": s, "time": 1.0 + s, "loss": 2.0,
               "grad_norm": 1.0, "param_norm": 10.0, "update_norm": 0.01}
        rec.update((over or {}).get(s, {}))
        out.append(rec)
    return out
