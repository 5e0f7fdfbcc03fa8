"""``update_ratio_high`` and ``update_ratio_low``: update_norm / param_norm outside its
hard limits (> 1e-1: the step rewrites the weights; < 1e-7: nothing is learnt).

Judged on the median of the last ``update_ratio_window`` steps (loss-scaler overflow steps
skipped), so one odd step never fires. The phase-aware band (early 1e-3..1e-2, mid
1e-4..1e-3, late 1e-5..1e-4) is reported in the evidence for context.

Five steps on a parameter norm of 10 with an update norm of 3 (each step rewrites 30% of
the weights), then of 1e-9 (nothing moves)::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> def findings(update_norm):
    ...     suite = DetectorSuite(DetectorSettings())
    ...     steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                            "update_norm": update_norm, "param_norm": 10.0})
    ...              for s in range(1, 6)]
    ...     return [f for rec in steps for f in suite.update(rec)]
    >>> high, low = findings(3.0), findings(1e-9)
    >>> [(f.type, f.step, f.severity.label) for f in high + low]
    [('update_ratio_high', 5, 'warning'), ('update_ratio_low', 5, 'warning')]
    >>> print(high[0].message)
    update/param ratio 0.3 (median of 5 steps) is above 0.1; healthy early-phase band 0.001..0.01
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import Field, model_validator

from monitor_agent.detectors.support.advice import NOT_LEARNING
from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.phase import UPDATE_BANDS, phase_of
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

UPDATE_RATIO_HIGH = (
    "update/param above 0.1: reduce the learning rate 5-10x.",
    "Lengthen warmup; check the schedule did not jump.",
)

UPDATE_RATIO_LOW = NOT_LEARNING


class UpdateRatioSettings(SharedSettings):
    """The knobs of ``update_ratio`` (``detectors:`` in the sidecar's config)."""

    update_ratio_min: float = Field(
        default=1e-7, gt=0,
        description="Hard lower limit of update/param.",
    )
    update_ratio_window: int = Field(
        default=5, ge=1, description="Steps whose median update/param ratio is judged."
    )

    @model_validator(mode="after")
    def _ratio_limits_ordered(self) -> UpdateRatioSettings:
        if self.update_ratio_min >= self.update_ratio_max:
            raise ValueError("update_ratio_min must be < update_ratio_max")
        return self


@dataclass(slots=True)
class RatioState:
    ratios: Window


class _UpdateRatioBase(DetectorBase[UpdateRatioSettings]):
    settings_model = UpdateRatioSettings
    high: bool = True

    def new_rank(self) -> RatioState:
        return RatioState(ratios=Window.of(self.settings.update_ratio_window))

    def on_step(self, rec: StepRecord, st: RatioState) -> list[Finding]:
        ratio = rec.update_ratio
        if amp_overflow(rec) or not finite(ratio):
            return []
        st.ratios.add(ratio)
        if not st.ratios.full:
            return []
        median = st.ratios.median()
        s = self.settings
        out = median > s.update_ratio_max if self.high else median < s.update_ratio_min
        if not out or not self.due(rec):
            return []
        return [self._finding(rec, median, len(st.ratios))]

    def _finding(self, rec: StepRecord, median: float, n: int) -> Finding:
        s = self.settings
        limit = s.update_ratio_max if self.high else s.update_ratio_min
        phase = phase_of(rec.step, self.ctx.warmup, self.ctx.state.total_steps)
        low, high = UPDATE_BANDS[phase]
        word = "above" if self.high else "below"
        msg = (f"update/param ratio {fmt(median)} (median of {n} steps) "
               f"is {word} {fmt(limit)}; healthy {phase}-phase band {fmt(low)}..{fmt(high)}")
        evidence = {"ratio": median, "last_ratio": rec.update_ratio, "phase": phase,
                    "band_low": low, "band_high": high, "lr": rec.lr}
        tip = UPDATE_RATIO_HIGH if self.high else UPDATE_RATIO_LOW
        return self.finding(rec, msg, value=median, threshold=limit, evidence=evidence,
                            suggestions=tip)


class UpdateRatioHighDetector(_UpdateRatioBase):
    """Warning when the median update/param ratio exceeds ``update_ratio_max``."""

    type = "update_ratio_high"
    severity = Severity.WARNING
    high = True


class UpdateRatioLowDetector(_UpdateRatioBase):
    """Warning when the median update/param ratio is below ``update_ratio_min``."""

    type = "update_ratio_low"
    severity = Severity.WARNING
    high = False
