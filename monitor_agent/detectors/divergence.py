"""``divergence``: the loss rising persistently while the gradient norm grows, caught
before the NaN.

Three rules, all relative to the run's own baselines:

* jump: after warmup, one step's update/param ratio above the hard limit
  ``update_ratio_max`` (the step rewrote over 10% of the weights) and
  ``divergence_jump`` x its rolling median: a learning-rate jump or an unclipped
  gradient blow-up, seen before the loss has even moved;

* fast: ``divergence_steps`` consecutive steps on which the loss rose and stands above
  ``divergence_ratio`` x its EMA while the grad norm also rose and stands above
  ``divergence_grad_ratio`` x its median (a runaway, e.g. learning rate too high);
* slow: after warmup, the median log-loss of the last ``divergence_window`` steps sits
  ``divergence_rise`` above the lowest such median seen and ``divergence_z`` standard
  errors above it (so a noisy small-batch loss needs a bigger rise), while the latest
  losses and grad norms sit above their window medians (a creeping blow-up).

A transient bad batch rises once and falls back, so it never makes a streak.

Example::

    det = DivergenceDetector(settings, ctx)
    det.update(step)   # -> [Finding(type="divergence", severity=ERROR, ...)]
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from monitor_agent import suggestions as tips
from monitor_agent.detectors.common import DetectorBase, fmt
from monitor_agent.detectors.nan_inf import amp_overflow
from monitor_agent.detectors.stats import Window, finite
from monitor_agent.types import Finding, StepRecord


@dataclass(slots=True)
class DivergenceState:
    grads: Window
    losses: Window
    ratios: Window
    prev_loss: float | None = None
    prev_grad: float | None = None
    streak: int = 0
    streak_start_loss: float | None = None
    lowest_median: float | None = None


class DivergenceDetector(DetectorBase):
    """Error when the loss and grad norm run away together (see module docstring)."""

    type = "divergence"

    def new_rank(self) -> DivergenceState:
        s = self.settings
        return DivergenceState(grads=Window.of(s.baseline_window),
                               losses=Window.of(s.divergence_window),
                               ratios=Window.of(s.baseline_window))

    def on_step(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        if amp_overflow(rec) or not finite(rec.loss):
            return []
        found = self._jump(rec, st)
        found = self._fast(rec, st) or self._slow(rec, st) or found
        st.prev_loss = rec.loss
        if finite(rec.grad_norm) and rec.grad_norm > 0:
            st.prev_grad = rec.grad_norm
            st.grads.add(math.log(rec.grad_norm))
        return found

    # -- jump: an update far too large ------------------------------------------------------

    def _jump(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        ratio = rec.update_ratio
        if not finite(ratio) or ratio <= 0:
            return []
        s = self.settings
        median = st.ratios.median() if len(st.ratios) >= s.min_history_steps else None
        st.ratios.add(ratio)
        if median is None or self.ctx.in_warmup(rec.step):
            return []
        if ratio <= s.update_ratio_max or ratio < s.divergence_jump * median:
            return []
        if not self.due(rec):
            return []
        msg = (f"update/param ratio jumped to {fmt(ratio)} ({ratio / median:.0f}x its median "
               f"{fmt(median)}; lr {fmt(rec.lr)}): a step this large precedes divergence")
        evidence = {"rule": "update_jump", "update_ratio": ratio, "median_ratio": median,
                    "lr": rec.lr, "loss": rec.loss, "grad_norm": rec.grad_norm}
        return [self.finding(rec, msg, value=ratio, threshold=s.update_ratio_max,
                             evidence=evidence, suggestions=tips.DIVERGENCE)]

    # -- fast: a runaway streak -------------------------------------------------------------

    def _rising(self, rec: StepRecord, st: DivergenceState) -> bool:
        s = self.settings
        ema = self.ctx.ema_loss(rec.rank)
        if st.prev_loss is None or ema is None or len(st.grads) < s.min_history_steps:
            return False
        loss_up = rec.loss > st.prev_loss and rec.loss >= s.divergence_ratio * abs(ema)
        if not finite(rec.grad_norm) or st.prev_grad is None:
            return loss_up
        median = math.exp(st.grads.median())
        grad_up = rec.grad_norm > st.prev_grad and rec.grad_norm >= s.divergence_grad_ratio * median
        return loss_up and grad_up

    def _fast(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        if not self._rising(rec, st):
            st.streak, st.streak_start_loss = 0, None
            return []
        if st.streak == 0:
            st.streak_start_loss = st.prev_loss
        st.streak += 1
        if st.streak < self.settings.divergence_steps or not self.due(rec):
            return []
        median = math.exp(st.grads.median())
        msg = (f"loss rose {st.streak} steps in a row to {fmt(rec.loss)} (from "
               f"{fmt(st.streak_start_loss)}) while grad norm grew to {fmt(rec.grad_norm)} "
               f"({fmt((rec.grad_norm or math.nan) / median)}x its median)")
        evidence = {"rule": "runaway", "streak": st.streak, "loss": rec.loss,
                    "loss_before": st.streak_start_loss, "ema": self.ctx.ema_loss(rec.rank),
                    "grad_norm": rec.grad_norm, "grad_median": median, "lr": rec.lr}
        return [self.finding(rec, msg, value=rec.loss, threshold=self.ctx.ema_loss(rec.rank),
                             evidence=evidence, suggestions=tips.DIVERGENCE)]

    # -- slow: a creeping rise ----------------------------------------------------------------

    def _slow(self, rec: StepRecord, st: DivergenceState) -> list[Finding]:
        if rec.loss <= 0:
            return []
        st.losses.add(math.log(rec.loss))
        if self.ctx.in_warmup(rec.step) or not st.losses.full:
            return []
        median = st.losses.median()
        if st.lowest_median is None or median < st.lowest_median:
            st.lowest_median = median
            return []
        rise = median - st.lowest_median
        # Standard error of a median: 1.2533 sigma / sqrt(n); sigma from the window's MAD.
        stderr = 1.2533 * st.losses.mad() / math.sqrt(len(st.losses))
        s = self.settings
        if rise < math.log1p(s.divergence_rise) or rise < s.divergence_z * stderr:
            return []
        if not self._still_rising(st) or not self.due(rec):
            return []
        now, low = math.exp(median), math.exp(st.lowest_median)
        msg = (f"loss median {fmt(now)} over the last {len(st.losses)} steps is "
               f"{now / low - 1:.0%} above its lowest {fmt(low)} and still rising")
        evidence = {"rule": "trend", "median": now, "lowest_median": low,
                    "rise_in_stderr": rise / max(stderr, 1e-12), "lr": rec.lr}
        return [self.finding(rec, msg, value=now, threshold=low, evidence=evidence,
                             suggestions=tips.DIVERGENCE)]

    def _still_rising(self, st: DivergenceState) -> bool:
        """The latest quarter of the window sits above the window's median (not a bump
        that already recovered), and so does the grad norm's."""
        values = st.losses.values()
        if np.median(values[-max(3, len(values) // 4):]) <= np.median(values):
            return False
        if len(st.grads) < 8:
            return True
        g = st.grads.values()
        return float(np.median(g[-len(g) // 4:])) > float(np.median(g))
