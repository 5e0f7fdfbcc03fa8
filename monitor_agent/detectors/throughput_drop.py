"""``throughput_drop``: tokens/s (or samples/s, or steps/s) much worse than the run's own
baseline, for a sustained stretch.

Speed is work per second in the unit the step reports: tokens when it reports tokens (or
the client's ``tokens_per_second``), else samples, else steps. A step whose work varies
(an RL step of one episode, whose length grows as the agent learns; a packed or bucketed
batch) is judged per unit of that work, so a longer step that did more is no slowdown;
only a run that reports neither is judged in steps. A run that changes the unit it
reports (tokens from some step on) starts its baseline again in the new unit.

Statistic: the median speed of the last ``throughput_window`` steps over the median of
the ``throughput_baseline_window`` steps before them; below ``throughput_ratio`` is slow,
and it must also be slower than every ``throughput_window``-step stretch of the baseline
(the median of each block of that many baseline steps): the speed's own variability, on a
machine shared with other jobs, is what a drop must exceed (measured on the corpus, run on
2 shared cores, 20-step medians swing 3x up and down for no reason in the job itself).
A median moves only when over half of its window is slow, so one slow step (an eval, a
checkpoint, the step after a stop, the last step of a run) never counts. The baseline
must hold at least half of ``throughput_baseline_window`` steps (after the first
``SKIP_FIRST_STEPS``), so the fast or slow first steps of a run (warmup, caches, a data
loader's prefetch) are never the whole baseline. It fires once the slow median has held
for ``throughput_window`` consecutive steps: the drop has lasted about one and a half
windows (30 steps by default), the time stated in the message in steps and seconds.
The evidence says whether the time went into waiting for data, which picks the suggestion.

A run at 4000 tokens/s that drops to 1600 at step 150 while data loading takes over the step::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "tokens_per_second": 4000.0 if s < 150 else 1600.0,
    ...                        "step_time": 0.5, "data_time": 0.01 if s < 150 else 0.3})
    ...          for s in range(1, 201)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]   # input_bound: data is 60%
    [('input_bound', 160, 'warning'), ('throughput_drop', 179, 'warning')]
    >>> print(found[-1].message)
    tokens/s median 1.6e+03 over the last 20 steps is 0.40x the median 4e+03 of the 154 steps
    before, for 20 steps in a row (19 s); data loading now 60% of the step
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

SKIP_FIRST_STEPS = 5  # the first steps include compilation and cache warm-up


THROUGHPUT_DATA = (
    "data_time rose: the data loader is starving the model; add workers, prefetch or pin memory.",
    "Check the storage / network the data comes from.",
)

THROUGHPUT_COMPUTE = (
    "Step time rose without data waits: check for other jobs on the device, thermal "
    "throttling, or a memory leak forcing allocator work.",
    "Profile a few steps (torch.profiler) and compare with the baseline.",
)


class ThroughputDropSettings(SharedSettings):
    """The knobs of ``throughput_drop`` (``detectors:`` in the sidecar's config)."""

    throughput_window: int = Field(
        default=20, ge=3,
        description="Recent steps whose median speed is compared to the baseline; the slow median"
        " must also hold this many steps in a row.",
    )
    throughput_baseline_window: int = Field(
        default=200, ge=10, description="Earlier steps forming the speed baseline (median)."
    )
    throughput_ratio: float = Field(
        default=0.6, gt=0, lt=1, description="Recent / baseline speed below this is a drop."
    )


@dataclass(slots=True)
class SpeedState:
    recent: Window
    baseline: Window
    recent_data: Window
    baseline_data: Window
    seen: int = 0
    slow_steps: int = 0
    slow_since: float | None = None
    unit: str = ""  # what the baseline measures: "tokens/s", "samples/s" or "steps/s"


def speed_of(rec: StepRecord) -> tuple[float, str] | None:
    """Work per second and its unit: tokens, else samples, else steps (module docstring)."""
    if finite(rec.tokens_per_second) and rec.tokens_per_second > 0:
        return rec.tokens_per_second, "tokens/s"
    if not (finite(rec.step_time) and rec.step_time > 0):
        return None
    for work, unit in ((rec.tokens, "tokens/s"), (rec.samples, "samples/s")):
        if finite(work) and work > 0:
            return work / rec.step_time, unit
    return 1.0 / rec.step_time, "steps/s"


def data_share(rec: StepRecord) -> float:
    wait = rec.input_wait  # the device's wait for data, as the goodput ledger's input
    if wait is not None and finite(rec.step_time) and rec.step_time > 0:
        return wait / rec.step_time
    return float("nan")


class ThroughputDropDetector(DetectorBase[ThroughputDropSettings]):
    """Warning when recent median speed < ``throughput_ratio`` x the baseline median."""

    type = "throughput_drop"
    severity = Severity.WARNING
    settings_model = ThroughputDropSettings

    def new_rank(self) -> SpeedState:
        s = self.settings
        return SpeedState(recent=Window.of(s.throughput_window),
                          baseline=Window.of(s.throughput_baseline_window),
                          recent_data=Window.of(s.throughput_window),
                          baseline_data=Window.of(s.throughput_baseline_window))

    def on_step(self, rec: StepRecord, st: SpeedState) -> list[Finding]:
        measured = speed_of(rec)
        st.seen += 1
        if measured is None or st.seen <= SKIP_FIRST_STEPS:
            return []
        speed, unit = measured
        if unit != st.unit:  # another unit: speeds in the old one say nothing of it
            if st.unit:
                fresh = self.new_rank()
                st.recent, st.baseline = fresh.recent, fresh.baseline
                st.recent_data, st.baseline_data = fresh.recent_data, fresh.baseline_data
                st.slow_steps, st.slow_since = 0, None
            st.unit = unit
        if st.recent.full:  # the oldest recent value moves into the baseline
            st.baseline.add(st.recent.values()[0])
            st.baseline_data.add(st.recent_data.values()[0])
        st.recent.add(speed)
        st.recent_data.add(data_share(rec))
        s = self.settings
        if len(st.baseline) < max(s.throughput_baseline_window // 2, s.min_history_steps):
            return []
        return self._judge(rec, st)

    def _judge(self, rec: StepRecord, st: SpeedState) -> list[Finding]:
        now, base = st.recent.median(), st.baseline.median()
        ratio = now / base
        slowest = _slowest_block(st.baseline.values(), st.recent.n) \
            if ratio < self.settings.throughput_ratio else 0.0
        if ratio >= self.settings.throughput_ratio or now >= slowest:
            st.slow_steps, st.slow_since = 0, None
            return []
        st.slow_steps += 1
        if st.slow_since is None:
            st.slow_since = rec.time
        if st.slow_steps < self.settings.throughput_window or not self.due(rec):
            return []
        data_now, data_base = _nanmedian(st.recent_data), _nanmedian(st.baseline_data)
        starved = finite(data_now) and data_now > max(2 * (data_base or 0.0), 0.1)
        unit = st.unit
        lasted = (rec.time - st.slow_since) if rec.time is not None and st.slow_since else None
        took = f" ({fmt(lasted)} s)" if lasted is not None else ""
        msg = (f"{unit} median {fmt(now)} over the last {st.recent.n} steps is {ratio:.2f}x "
               f"the median {fmt(base)} of the {st.baseline.n} steps before, for "
               f"{st.slow_steps} steps in a row{took}"
               + (f"; data loading now {data_now:.0%} of the step" if starved else ""))
        evidence = {"speed": now, "baseline": base, "ratio": ratio,
                    "consecutive_steps": st.slow_steps, "seconds": lasted,
                    "slowest_baseline_stretch": slowest,
                    "data_share": data_now, "baseline_data_share": data_base}
        tip = THROUGHPUT_DATA if starved else THROUGHPUT_COMPUTE
        # threshold is the baseline the message names (shown as "value ... vs baseline ...").
        return [self.finding(rec, msg, value=now, threshold=base,
                             evidence=evidence, suggestions=tip)]


def _slowest_block(values: np.ndarray, size: int) -> float:
    """The lowest median of consecutive ``size``-value blocks of ``values``."""
    n = len(values) // size
    if n == 0:
        return float("inf")
    blocks = values[len(values) - n * size:].reshape(n, size)
    return float(np.median(blocks, axis=1).min())


def _nanmedian(w: Window) -> float:
    v = w.values()
    v = v[np.isfinite(v)]
    return float(np.median(v)) if len(v) else float("nan")
