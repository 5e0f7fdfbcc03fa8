"""When each rank last completed a step, and whether its watchdog reported it stuck.

``stalled`` (a silence past the rank's usual interval) and ``hang`` (where the stuck ranks
are) read the same per-rank facts; this is the one place they are kept. A step moves the
rank on (and ends a hang it reported); a hang report counts only if no later step came.

    >>> from monitor_agent.detectors.support.stats import Window
    >>> from monitor_agent.records.types import HangRecord, StepRecord
    >>> st = Liveness(intervals=Window.of(10))
    >>> for s in (1, 2, 3):
    ...     st.saw_step(StepRecord(run_id="r", step=s, time=10.0 * s))
    >>> st.saw_hang(HangRecord(run_id="r", step=3, time=95.0, stuck_seconds=65.0))
    True
    >>> st.intervals.median(), st.last_step, st.hang_step
    (10.0, 3, 3)
    >>> st.saw_step(StepRecord(run_id="r", step=4, time=100.0)); st.hang_step
    -1
"""

from __future__ import annotations

from dataclasses import dataclass

from monitor_agent.detectors.support.stats import Window
from monitor_agent.records.types import HangRecord, StepRecord


@dataclass(slots=True)
class Liveness:
    intervals: Window            # seconds between the rank's steps
    run_id: str = ""
    last_step: int = -1
    last_time: float | None = None
    hang_step: int = -1          # the step its watchdog reported it stuck after (-1: none)

    def saw_step(self, rec: StepRecord) -> None:
        if self.last_time is not None and rec.time > self.last_time:
            self.intervals.add(rec.time - self.last_time)
        self.run_id, self.last_step = rec.run_id, max(self.last_step, rec.step)
        self.last_time = rec.time if self.last_time is None else max(self.last_time, rec.time)
        if self.hang_step >= 0 and rec.step > self.hang_step:
            self.hang_step = -1  # it moved on: no longer hung

    def saw_hang(self, rec: HangRecord) -> bool:
        """Take a hang report; False when a later step already showed it moved on."""
        if rec.step < self.last_step:
            return False
        self.run_id, self.hang_step = rec.run_id, rec.step
        if self.last_time is None:
            self.last_step = rec.step
        return True
