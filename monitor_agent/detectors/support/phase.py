"""Training phase of a step and the healthy update/param band for it.

Rules of thumb for update_norm / param_norm per step: early (warmup and the first 10% of
the run) 1e-3..1e-2, mid 1e-4..1e-3, late (last 30%) 1e-5..1e-4. They vary with model
and optimizer, so the bands are reported as context; the findings fire on hard limits.

A step past warmup in a run of unknown length is mid-run; with the length known, the last
30% is late::

    >>> phase_of(step=500, warmup=50, total=None), UPDATE_BANDS["mid"]
    ('mid', (0.0001, 0.001))
    >>> [phase_of(step, warmup=50, total=1000) for step in (40, 80, 500, 900)]
    ['early', 'early', 'mid', 'late']
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
