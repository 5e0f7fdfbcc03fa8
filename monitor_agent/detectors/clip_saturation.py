"""``clip_saturation``: the gradient is clipped on most steps (grad norm above the clip
threshold on ``clip_fraction`` of the last ``clip_window`` steps).

The finding's value is the window's median grad norm and its threshold the clip threshold
(what it is compared against); the message and evidence give the clipped fraction and its
limit ``clip_fraction``.

Example::

    ClipSaturationDetector(settings, ctx).update(step)  # -> [Finding("clipped on 95% ...")]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from monitor_agent import suggestions as tips
from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.types import Finding, StepRecord


@dataclass(slots=True)
class ClipState:
    over: Window  # grad_norm / clip_threshold per step


class ClipSaturationDetector(DetectorBase):
    """Warning when most recent steps were clipped."""

    type = "clip_saturation"

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
                             suggestions=tips.CLIP_SATURATION)]
