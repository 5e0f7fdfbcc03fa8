"""``input_bound``: every rank of the run waits on its data loader for a large share of
each step: the input pipeline, not the model, sets the pace.

Statistic: each rank's median share of the step the device waits for data over its last
``input_bound_window`` steps (after its first ``SKIP_FIRST_STEPS``: a loader's workers start
and fill their queues then). The wait is ``StepRecord.input_wait``: the loader's wait
(``data_time``), or on a GPU the part of it the device spent idle (``data_idle_time``),
the very seconds the goodput ledger charges as ``input``, so the two never disagree. The
run is input-bound when every rank's median is at least ``input_bound_share``.

Why 0.5: the baseline is the run's own step without the wait. A share of 0.5 is a step
that waits on data as long as it computes: the accelerator idles half the time and a
loader that kept up would make training up to 2x faster. A loader that keeps up (workers
and prefetch ahead of the model) hands over a ready batch, so its share is the cost of
a queue pop: the recorded runs of tests/traces stay at or below 0.21 (the highest 20-step
median of any rank, a CPU CNN whose loader runs in the training process), 2.4x below the
limit; only the labelled loader fault (throughput_drop_gpt, 40 ms of loading per batch)
reaches 0.67. A median moves only when over half the window waits, so a few slow batches
(an epoch's first, a checkpoint) never count, and "every rank" keeps one slow rank out:
that rank is a straggler (``straggler`` names it, its cause ``data``), the others wait for
it in the all-reduce, not on data.

It reports once when the condition starts and every ``repeat_every_steps`` while it holds,
one finding for the run (the default rule fingerprints nothing: one alert); when the share
falls the findings stop and the alert resolves (``resolve_after``).

Two ranks whose loaders take 60 ms of a 100 ms step::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "rank": r,
    ...                        "step_time": 0.1, "data_time": 0.06}) for s in range(1, 31)
    ...          for r in (0, 1)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found if f.type == "input_bound"]
    [('input_bound', 25, 'warning')]
    >>> print(found[-1].message)
    the run is input-bound: every rank waits on its data loader for 60% of the step (median
    of the last 20 steps, 60% to 60% across 2 ranks); the model idles while data loads
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

SKIP_FIRST_STEPS = 5  # workers start and fill their prefetch queues

INPUT_BOUND = (
    "Give the DataLoader more workers (num_workers, up to the CPU cores each rank has) and "
    "persistent_workers=True so they are not restarted every epoch.",
    "pin_memory=True (with .to(device, non_blocking=True)) and a larger prefetch_factor, so "
    "a batch is ready before the step asks for it.",
    "If the workers are already many, the storage or the decoding is the limit: cache or "
    "pre-process the data, or read it from faster storage.",
)


class InputBoundSettings(SharedSettings):
    """The knobs of ``input_bound`` (``detectors:`` in the sidecar's config)."""

    input_bound_share: float = Field(
        default=0.5, gt=0, lt=1, description="Median data_time / step_time every rank must "
        "reach: 0.5 is a step that waits on data as long as it computes.")
    input_bound_window: int = Field(
        default=20, ge=3, description="Steps per rank whose median share is judged.")


@dataclass(slots=True)
class DataShare:
    shares: Window
    seen: int = 0


class InputBoundDetector(DetectorBase[InputBoundSettings]):
    """Warning when every rank's median data share is ``input_bound_share`` or more."""

    type = "input_bound"
    severity = Severity.WARNING
    settings_model = InputBoundSettings
    scope = "run"

    def new_rank(self) -> DataShare:
        return DataShare(shares=Window.of(self.settings.input_bound_window))

    def __init__(self, settings: InputBoundSettings, ctx: DetectorContext) -> None:
        super().__init__(settings, ctx)
        self.judged = -1  # the step the last judgement covered

    def on_step(self, rec: StepRecord, st: DataShare) -> list[Finding]:
        wait = rec.input_wait
        if wait is None or not (finite(rec.step_time) and rec.step_time > 0):
            return []
        st.seen += 1
        if st.seen <= SKIP_FIRST_STEPS:
            return []
        st.shares.add(min(wait / rec.step_time, 1.0))
        # Judged once a step, when every live rank reported it (support/front.py): the
        # record that completes the step judges it, O(ranks) once a step rather than a
        # median of every rank's window on every record.
        through = self.ctx.front.judged_through()
        if through <= self.judged:
            return []
        self.judged = through
        windows = [o.shares for o in self.ranks.values()]
        if not all(w.full for w in windows):  # every rank judged on a full window
            return []
        medians = _medians(np.stack([w.buf for w in windows]))
        low, high = float(medians[0]), float(medians[-1])
        limit = self.settings.input_bound_share
        if low < limit or not self.repeat.due("run", rec.step, self.settings.repeat_every_steps):
            return []
        mid = float(medians[len(medians) // 2])
        msg = (f"the run is input-bound: every rank waits on its data loader for {mid:.0%} of "
               f"the step (median of the last {self.settings.input_bound_window} steps, "
               f"{low:.0%} to {high:.0%} across {_ranks(len(medians))}); the model idles while "
               "data loads")
        evidence = {"data_share": mid, "min_rank_share": low, "max_rank_share": high,
                    "ranks": len(medians), "data_time": rec.data_time,
                    "step_time": rec.step_time}
        return [self.finding(rec, msg, value=low, threshold=limit, evidence=evidence,
                             suggestions=INPUT_BOUND)]

    def snapshot_extra(self) -> dict[str, Any]:
        return {"judged": self.judged}

    def restore_extra(self, data: dict[str, Any]) -> None:
        self.judged = int(data.get("judged", -1))


def _medians(windows: np.ndarray) -> np.ndarray:
    """Each full window's median (a row each), sorted: one sort of the ranks x window
    array, the middle column(s) read off."""
    s = np.sort(windows, axis=1)
    n = s.shape[1]
    mid = s[:, n // 2] if n % 2 else 0.5 * (s[:, n // 2 - 1] + s[:, n // 2])
    return np.sort(mid)


def _ranks(n: int) -> str:
    return "1 rank" if n == 1 else f"{n} ranks"
