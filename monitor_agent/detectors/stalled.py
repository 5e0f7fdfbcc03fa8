"""``stalled``: no step from a rank for much longer than its usual step interval.

The decision is pure: ``tick(now)`` compares ``now`` (injected: wall time live, record
time offline (pipeline/trace_judge.py), where a trace without an end record gets a last tick
``stall_horizon_seconds`` after its last record) with each rank's last step time. The
limit is ``stall_factor`` x the median interval between its steps, never less than
``stall_min_seconds``. An ended run never stalls, and neither does one whose rank reported a
hang at its last step (the client's watchdog): the ``hang`` page says where every rank is.

Ten steps a second apart, then silence: 299 s later is within ``stall_min_seconds``, 301 s
is a stall::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> for s in range(1, 11):
    ...     _ = suite.update(parse_record({"kind": "step", "run_id": "r", "step": s, "time": s}))
    >>> suite.tick(now=10 + 299.0)
    []
    >>> [(f.type, f.step, f.severity.label, f.threshold) for f in suite.tick(now=10 + 301.0)]
    [('stalled', 10, 'error', 300.0)]
"""

from __future__ import annotations

from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.liveness import Liveness
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window
from monitor_agent.records.types import Finding, HangRecord, Record, Severity, StepRecord

MIN_INTERVALS = 5  # intervals needed before the median step interval means anything


STALLED = (
    "The job stopped reporting: check it is alive (hung collective, deadlocked data loader, "
    "preemption); py-spy dump the process.",
    "For NCCL hangs set NCCL_ASYNC_ERROR_HANDLING / a collective timeout so it fails fast.",
)


class StalledSettings(SharedSettings):
    """The knobs of ``stalled`` (``detectors:`` in the sidecar's config)."""

    stall_factor: float = Field(
        default=20.0, gt=1, description="Silence of this many median step intervals: stalled."
    )
    stall_min_seconds: float = Field(
        default=300.0, ge=0, description="Silence shorter than this is never a stall (checkpoints)."
    )
    stall_repeat_seconds: float = Field(
        default=600.0, gt=0, description="A stall that persists is re-reported this often."
    )


class StalledDetector(DetectorBase[StalledSettings]):
    """Error when a rank is silent for ``stall_factor`` x its median step interval."""

    type = "stalled"
    severity = Severity.ERROR
    settings_model = StalledSettings
    scope = "run"

    def new_rank(self) -> Liveness:
        return Liveness(intervals=Window.of(self.settings.baseline_window))

    def update(self, record: Record) -> list[Finding]:
        if isinstance(record, HangRecord):
            self._rank(record.rank).saw_hang(record)
        return super().update(record)

    def on_step(self, rec: StepRecord, st: Liveness) -> list[Finding]:
        st.saw_step(rec)
        return []

    def limit(self, st: Liveness) -> float | None:
        if len(st.intervals) < MIN_INTERVALS:
            return None
        return max(self.settings.stall_factor * st.intervals.median(),
                   self.settings.stall_min_seconds)

    def tick(self, now: float) -> list[Finding]:
        if self.ctx.state.ended:
            return []
        if any(st.hang_step >= 0 for st in self.ranks.values()):
            # A rank's watchdog reported where it is stuck: the ``hang`` page says more
            # than a silence can (every rank's frame, and which processes are gone).
            return []
        found = []
        for rank, st in sorted(self.ranks.items()):
            limit = self.limit(st)
            if limit is None or st.last_time is None or now - st.last_time <= limit:
                continue
            if self.repeat.due(str(rank), now, self.settings.stall_repeat_seconds):
                found.append(self._finding(rank, st, now, limit, st.last_time))
        return found

    def _finding(self, rank: int, st: Liveness, now: float, limit: float,
                 last_time: float) -> Finding:
        silent = now - last_time
        median = st.intervals.median()
        msg = (f"no step from rank {rank} for {silent:.0f} s after step {st.last_step} "
               f"(usual interval {median:.3g} s, limit {limit:.0f} s)")
        return Finding(
            type=self.type, severity=self.severity, run_id=st.run_id,
            step=st.last_step, rank=rank, value=silent, threshold=limit, message=msg,
            evidence={"silent_seconds": silent, "median_interval": median,
                      "last_step_time": last_time},
            suggestions=STALLED, time=now,
        )
