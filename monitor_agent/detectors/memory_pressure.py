"""``memory_pressure``: memory near the device total, or climbing steadily (a leak).

Near the total: ``allocated / total`` above ``memory_high`` (warning) or
``memory_critical`` (error). Leak: over the last ``memory_leak_window`` steps memory rose
on at least half the steps and its last quarter's median sits more than
``memory_leak_fraction`` of the total above its first quarter's (or of the starting
level when the total is unknown); the evidence projects the steps left before the total.

Memory growing by 32 MiB a step on a 16 GiB device, long before it is near the total (the
first 10 readings are skipped, then the 50-step window fills)::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> MiB = 2**20
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "memory": {
    ...     "allocated_bytes": (4096 + 32 * s) * MiB, "total_bytes": 16384 * MiB}})
    ...     for s in range(1, 61)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('memory_pressure', 60, 'warning')]
    >>> print(found[0].message)
    memory grew 1216 MiB over 50 steps (32.00 MiB/step, rising on 100% of steps); the total is
    reached in ~324 steps
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field, model_validator

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite, slope
from monitor_agent.records.types import Finding, Severity, StepRecord

MiB = 1024.0 * 1024.0
SKIP_FIRST_STEPS = 10  # allocators and caches fill up during the first steps


MEMORY_HIGH = (
    "Memory is near the device total: reduce batch size, enable activation checkpointing, "
    "or use mixed precision.",
    "Call optimizer.zero_grad(set_to_none=True) and free references to old tensors.",
)

MEMORY_LEAK = (
    "Memory grows every step: look for tensors kept across steps (losses appended without "
    ".item() or .detach(), retain_graph=True, growing caches).",
    "Compare torch.cuda.memory_summary() (or tracemalloc) at two steps to find what grows.",
)


class MemoryPressureSettings(SharedSettings):
    """The knobs of ``memory_pressure`` (``detectors:`` in the sidecar's config)."""

    memory_high: float = Field(
        default=0.9, gt=0, le=1,
        description="allocated / total from which memory pressure is a warning.",
    )
    memory_critical: float = Field(
        default=0.97, gt=0, le=1, description="allocated / total from which it is an error."
    )
    memory_leak_window: int = Field(
        default=50, ge=5, description="Steps over which steady memory growth is judged."
    )
    memory_leak_fraction: float = Field(
        default=0.05, gt=0, description="Growth over the window (fraction of total) that is a leak."
    )

    @model_validator(mode="after")
    def _memory_levels_ordered(self) -> MemoryPressureSettings:
        if self.memory_critical < self.memory_high:
            raise ValueError("memory_critical must be >= memory_high")
        return self


@dataclass(slots=True)
class MemoryState:
    used: Window
    seen: int = 0


class MemoryPressureDetector(DetectorBase[MemoryPressureSettings]):
    """Warning/error near the device total; warning on a steady leak."""

    type = "memory_pressure"
    severity = Severity.WARNING
    settings_model = MemoryPressureSettings

    def new_rank(self) -> MemoryState:
        return MemoryState(used=Window.of(self.settings.memory_leak_window))

    def on_step(self, rec: StepRecord, st: MemoryState) -> list[Finding]:
        mem = rec.memory
        if mem is None or not finite(mem.allocated_bytes):
            return []
        st.seen += 1
        total = mem.total_bytes if finite(mem.total_bytes) and mem.total_bytes > 0 else None
        high = self._near_total(rec, mem.allocated_bytes, total)
        if st.seen <= SKIP_FIRST_STEPS:
            return high
        st.used.add(mem.allocated_bytes)
        return high or self._leak(rec, st, total)

    def _near_total(self, rec: StepRecord, used: float, total: float | None) -> list[Finding]:
        s = self.settings
        if total is None or used < s.memory_high * total or not self.due(rec):
            return []
        frac = used / total
        sev = Severity.ERROR if frac >= s.memory_critical else Severity.WARNING
        msg = f"memory {used / MiB:.0f} MiB is {frac:.0%} of the device's {total / MiB:.0f} MiB"
        return [self.finding(rec, msg, value=used, threshold=s.memory_high * total,
                             evidence={"used_bytes": used, "total_bytes": total, "fraction": frac},
                             suggestions=MEMORY_HIGH, severity=sev)]

    def _leak(self, rec: StepRecord, st: MemoryState, total: float | None) -> list[Finding]:
        if not st.used.full:
            return []
        v = st.used.values()
        q = max(1, len(v) // 4)
        # Quarter medians, not endpoints: allocator churn makes single readings jumpy.
        growth = float(np.median(v[-q:]) - np.median(v[:q]))
        scale = total if total is not None else float(v[0])
        rising = float(np.mean(np.diff(v) > 0))
        if growth < self.settings.memory_leak_fraction * scale or rising < 0.5:
            return []
        if not self.due(rec):
            return []
        per_step = slope(v)
        left = (total - v[-1]) / per_step if total is not None and per_step > 0 else None
        msg = (f"memory grew {growth / MiB:.0f} MiB over {len(v)} steps "
               f"({per_step / MiB:.2f} MiB/step, rising on {rising:.0%} of steps)"
               + (f"; the total is reached in ~{left:.0f} steps" if left is not None else ""))
        evidence = {"growth_bytes": growth, "bytes_per_step": per_step, "rising_fraction": rising,
                    "used_bytes": float(v[-1]), "total_bytes": total, "steps_left": left}
        return [self.finding(rec, msg, value=float(v[-1]), threshold=total, evidence=evidence,
                             suggestions=MEMORY_LEAK)]
