"""``straggler``: one rank's own compute time far above the other ranks' of the same run.

In synchronous data parallelism every rank waits for the slowest at the all-reduce, so
``step_time`` rises everywhere; the straggler shows in its own work (``compute_time``, or
``step_time - sync_wait_time``). Each rank's median over ``straggler_window`` steps is
compared with the median of the other ranks' medians.

Two ranks, interleaved as they arrive; rank 1 computes for 80 ms where rank 0 takes 20::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "rank": r,
    ...                        "step_time": 0.1, "compute_time": 0.02 + 0.06 * r})
    ...          for s in range(1, 21) for r in (0, 1)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.rank, f.severity.label) for f in found]
    [('straggler', 20, 1, 'warning')]
    >>> print(found[0].message)
    rank 1 takes 4.0x the other ranks' time for its own work (80.0 ms vs 20.0 ms median)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

STRAGGLER = (
    "One rank computes much slower than the others: check that host (thermal throttling, "
    "other processes, a failing GPU, NUMA/CPU binding).",
    "Check its data loader and storage; uneven shards make one rank slower.",
)


class StragglerSettings(SharedSettings):
    """The knobs of ``straggler`` (``detectors:`` in the sidecar's config)."""

    straggler_ratio: float = Field(
        default=1.5, gt=1, description="A rank's median compute time over the others' median."
    )
    straggler_window: int = Field(default=20, ge=3, description="Steps per rank in the comparison.")


@dataclass(slots=True)
class RankTimes:
    times: Window


def own_time(rec: StepRecord) -> float | None:
    if finite(rec.compute_time):
        return rec.compute_time
    if finite(rec.step_time) and finite(rec.sync_wait_time):
        return rec.step_time - rec.sync_wait_time
    return rec.step_time if finite(rec.step_time) else None


class StragglerDetector(DetectorBase[StragglerSettings]):
    """Warning for a rank whose median own time is ``straggler_ratio`` x the others'."""

    type = "straggler"
    severity = Severity.WARNING
    settings_model = StragglerSettings

    def new_rank(self) -> RankTimes:
        return RankTimes(times=Window.of(self.settings.straggler_window))

    def on_step(self, rec: StepRecord, st: RankTimes) -> list[Finding]:
        t = own_time(rec)
        if t is None or t <= 0:
            return []
        st.times.add(t)
        others = [o.times.median() for r, o in self.ranks.items() if r != rec.rank and o.times.full]
        if not st.times.full or not others:
            return []
        mine, theirs = st.times.median(), float(np.median(others))
        ratio = mine / theirs if theirs > 0 else float("inf")
        if ratio < self.settings.straggler_ratio or not self.due(rec):
            return []
        msg = (f"rank {rec.rank} takes {ratio:.1f}x the other ranks' time for its own work "
               f"({mine * 1000:.1f} ms vs {theirs * 1000:.1f} ms median)")
        evidence = {"own_time": mine, "others_median": theirs, "ratio": ratio,
                    "ranks": len(others) + 1, "sync_wait_time": rec.sync_wait_time}
        return [self.finding(rec, msg, value=mine, threshold=theirs * self.settings.straggler_ratio,
                             evidence=evidence, suggestions=STRAGGLER)]
