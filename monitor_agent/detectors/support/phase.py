"""Training phase of a step and the healthy update/param band for it.

Rules of thumb for update_norm / param_norm per step: early (warmup and the first 10% of
the run) 1e-3..1e-2, mid 1e-4..1e-3, late (last 30%) 1e-5..1e-4. They vary with model
and optimizer, so the bands are reported as context; the findings fire on hard limits.

Example::

    phase_of(step=500, warmup=50, total=1000)    # "mid"
    UPDATE_BANDS["mid"]                           # (1e-4, 1e-3)
"""

from __future__ import annotations

UPDATE_BANDS: dict[str, tuple[float, float]] = {
    "early": (1e-3, 1e-2),
    "mid": (1e-4, 1e-3),
    "late": (1e-5, 1e-4),
}


def phase_of(step: int, warmup: int, total: int | None) -> str:
    if step <= warmup:
        return "early"
    if not total:
        return "mid"
    progress = step / total
    if progress < 0.1:
        return "early"
    return "mid" if progress < 0.7 else "late"
