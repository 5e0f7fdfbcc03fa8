"""Raw records of a two-rank run as its clients would send them, for the tests that drive a
sidecar's rollback decisions by hand (test_rollback_decision.py, test_crash_boundaries.py):
one batch per step, each rank under its own attempt token ``<token><rank>``."""

from __future__ import annotations

from typing import Any


def step(run: str, step: int, rank: int, token: str, loss: float | str = 2.0,
         skipped: int = 0) -> dict[str, Any]:
    """One batch per step; ``skipped``: batches the data stream jumped over since step 1."""
    return {"kind": "step", "run_id": run, "rank": rank, "step": step, "time": 1000.0 + step,
            "loss": loss, "grad_norm": 1.0, "attempt": f"{token}{rank}",
            "data_position": step + skipped}


def both(run: str, steps: range, token: str, nan_at: int | None = None,
         skipped: int = 0) -> list[dict[str, Any]]:
    """``steps`` of both ranks, the loss NaN on both at ``nan_at``."""
    return [step(run, s, r, token, "NaN" if s == nan_at else 2.0, skipped)
            for s in steps for r in (0, 1)]
