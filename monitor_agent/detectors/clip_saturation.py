"""``clip_saturation``: the gradient is clipped on most steps (grad norm above the clip
threshold on ``clip_fraction`` of the last ``clip_window`` steps).

The finding's value is the window's median grad norm and its threshold the clip threshold
(what it is compared against); the message and evidence give the clipped fraction and its
limit ``clip_fraction``.

Every step's gradient norm at 1.5x a clip threshold of 1.0, judged over a 20-step window::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings(clip_window=20))
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "grad_norm": 1.5, "clip_threshold": 1.0}) for s in range(1, 31)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('clip_saturation', 20, 'warning')]
    >>> print(found[0].message)
    gradient clipped on 100% of the last 20 steps (limit 80%); median grad norm 1.5x the clip
    threshold 1
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

CLIP_SATURATION = (
    "Clipping on most steps means the learning rate is likely too high: lower it.",
    "If the gradient norm grows naturally during training, raise the clip threshold; "
    "constant clipping turns the optimizer into sign-SGD.",
)


class ClipSaturationSettings(SharedSettings):
    """The knobs of ``clip_saturation`` (``detectors:`` in the sidecar's config)."""

    clip_window: int = Field(default=50, ge=5, description="Steps judged for clip saturation.")
    clip_fraction: float = Field(
        default=0.8, gt=0, le=1, description="Fraction of clipped steps that saturates."
    )


@dataclass(slots=True)
class ClipState:
    over: Window  # grad_norm / clip_threshold per step


class ClipSaturationDetector(DetectorBase[ClipSaturationSettings]):
    """Warning when most recent steps were clipped."""

    type = "clip_saturation"
    severity = Severity.WARNING
    settings_model = ClipSaturationSettings

    def new_rank(self) -> ClipState:
        return ClipState(over=Window.of(self.settings.clip_window))

    def on_step(self, rec: StepRecord, st: ClipState) -> list[Finding]:
        clip = rec.clip_threshold
        if amp_overflow(rec) or not finite(rec.grad_norm) or not finite(clip) or clip <= 0:
            return []
        st.over.add(rec.grad_norm / clip)
        if not st.over.full:
            return []
        values = st.over.values()
        fraction = float(np.mean(values > 1.0))
        if fraction < self.settings.clip_fraction or not self.due(rec):
            return []
        median = float(np.median(values))
        msg = (f"gradient clipped on {fraction:.0%} of the last {len(values)} steps (limit "
               f"{self.settings.clip_fraction:.0%}); median grad norm {fmt(median)}x the clip "
               f"threshold {fmt(clip)}")
        return [self.finding(rec, msg, value=median * clip, threshold=clip,
                             evidence={"fraction": fraction,
                                       "limit_fraction": self.settings.clip_fraction,
                                       "median_over_clip": median,
                                       "clip_threshold": clip, "lr": rec.lr},
                             suggestions=CLIP_SATURATION)]
