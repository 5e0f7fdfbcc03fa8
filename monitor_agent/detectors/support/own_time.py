"""A step's own time: the part of a rank's step that is its own doing (data + compute), not
the wait for the slowest rank in the collective. ``straggler`` compares it across ranks, and
``gpu_health`` compares a throttling GPU's against its peers'.

Data + compute when the client timed them; else the step less its all-reduce wait; else
the whole step (a positive one only)::

    >>> from monitor_agent.records.types import StepRecord
    >>> own_time(StepRecord(run_id="r", step=1, time=1.0, data_time=0.2, compute_time=0.5))
    0.7
    >>> own_time(StepRecord(run_id="r", step=1, time=1.0, step_time=1.0, sync_wait_time=0.25))
    0.75
    >>> own_time(StepRecord(run_id="r", step=1, time=1.0)) is None
    True
"""

from __future__ import annotations

from monitor_agent.detectors.support.stats import finite
from monitor_agent.records.types import StepRecord


def own_time(rec: StepRecord) -> float | None:
    """Data + compute seconds of ``rec``'s step (see module docstring); None if unknown."""
    data = rec.input_wait or 0.0  # the device's wait for data (records/types.py)
    if finite(rec.compute_time):
        return rec.compute_time + data
    if finite(rec.step_time) and finite(rec.sync_wait_time):
        return rec.step_time - rec.sync_wait_time
    return rec.step_time if finite(rec.step_time) and rec.step_time > 0 else None
