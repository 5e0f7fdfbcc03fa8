"""``effective_lr_shift``: the optimizer amplifies or damps the gradient far beyond its
usual ratio, for a sustained stretch.

The effective learning rate is ``||update|| / ||clipped gradient||``: the step the optimizer
really took per unit of gradient (``StepRecord.effective_lr``, on layer-statistics steps).
For plain SGD it equals the lr; momentum, Adam's normalisation and weight decay make it
differ, by a ratio that is characteristic of the run and drifts slowly. The statistic is
``x = log(effective_lr / lr)``, so a schedule (warmup, decay, restarts) does not move it; a
shift of ``x`` is the optimizer, not the schedule.

Threshold, in units of its own noise: ``x`` against the median of its last ``WINDOW``
readings, in robust sigmas (``MAD_TO_SIGMA * MAD``). A reading is *shifted* when it is at least
``SHIFT_Z`` (8) sigma and at least ``SHIFT_RATIO`` (10x, an order of magnitude) from that
median. 8 sigma: on readings every ``layer_stats_every`` steps, a healthy run produces a
few hundred readings, and a normal tail that far out has probability ~1e-15; the 10x floor
keeps a run whose ratio is nearly constant (plain SGD, MAD near zero) from firing on a
small, harmless change (a 2x momentum transient is not the optimizer misbehaving). It
fires on ``SHIFT_READINGS`` (3) shifted readings in a row - one odd step is a batch, three
consecutive layer-statistics steps are a regime (with the default interval, 75 steps).
The shifted readings stay out of the median, so a shift never becomes its own baseline.

What is left out, and why:
* warmup steps (Adam's moment estimates and bias correction are settling) and the first
  ``MIN_READINGS`` readings after them;
* loss-scaler overflow steps, steps with a non-finite or zero gradient norm, lr 0;
* readings whose clipped gradient norm is itself outside 3x its own rolling median: for
  Adam ``effective_lr`` scales as ``1 / ||g||``, so a gradient explosion or collapse moves
  it without the optimizer doing anything unusual, and ``grad_explosion`` /
  ``grad_vanishing`` are the findings that speak to that. Such readings still join both
  windows, so when the gradient settles at a new level the ratio's baseline has moved
  with it.

Twenty steps that move the weights about one lr per unit of gradient, then three that move
them 50x as far at the same lr and gradient (the run without warmup)::

    >>> import math
    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> run = parse_record({"kind": "run", "run_id": "r", "config": {"warmup_steps": 0}})
    >>> updates = [(1e-3 if s <= 20 else 5e-2) * (1 + 0.1 * math.sin(3 * s)) for s in range(1, 24)]
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "lr": 1e-3,
    ...                        "grad_norm": 1.0, "update_norm": u})
    ...          for s, u in enumerate(updates, start=1)]
    >>> found = [f for rec in [run, *steps] for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('effective_lr_shift', 23, 'warning')]
    >>> print(found[0].message)
    effective lr 0.0494 (||update|| / ||clipped grad||) is 49.4x the lr 0.001, against a usual
    0.993x: 50x above its median (36 sigma) on 3 layer-statistics steps in a row; the optimizer
    amplifies the gradient far beyond its usual ratio
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import Severity

WINDOW = 32
MIN_READINGS = 10
SHIFT_Z = 8.0
SHIFT_RATIO = 10.0
SHIFT_READINGS = 3
GRAD_BAND = 3.0  # the clipped gradient's own band: beyond it the shift is the gradient's
SIGMA_FLOOR = 1e-3


EFFECTIVE_LR_AMPLIFIED = (
    "The optimizer now takes far larger steps per unit of gradient than it did: with Adam-"
    "family optimizers, check eps (too small lets a near-zero second moment blow a step up) "
    "and whether the optimizer state was reset or reloaded wrongly on a resume.",
    "Check every param group's lr and the scheduler: the reported lr is the first group's.",
    "Lower the learning rate or enable gradient clipping until the ratio is back in its band.",
)

EFFECTIVE_LR_DAMPED = (
    "The optimizer now takes far smaller steps per unit of gradient than it did: check for a "
    "second moment inflated by a few huge gradients (Adam's v decays over 1/(1-beta2) steps).",
    "Check weight decay, gradient accumulation scaling and any per-group lr the scheduler sets.",
    "If it is deliberate (a schedule the reported lr does not show), silence this warning.",
)


@dataclass(slots=True)
class EffectiveLrState:
    ratios: Window = field(default_factory=lambda: Window.of(WINDOW))  # log(eff / lr)
    grads: Window = field(default_factory=lambda: Window.of(WINDOW))   # log clipped grad
    streak: int = 0
    sign: int = 0


class EffectiveLrDetector(DetectorBase[SharedSettings]):
    """Warning when log(effective lr / lr) leaves its own band and stays (see docstring)."""

    type = "effective_lr_shift"
    severity = Severity.WARNING
    settings_model = SharedSettings

    def new_rank(self) -> EffectiveLrState:
        return EffectiveLrState()

    def on_step(self, rec, st: EffectiveLrState) -> list:
        eff = rec.effective_lr
        if (eff is None or not finite(eff) or eff <= 0 or amp_overflow(rec)
                or not finite(rec.lr) or rec.lr <= 0 or self.ctx.in_warmup(rec.step)):
            return []
        x = math.log(eff / rec.lr)
        log_g = math.log(rec.grad_norm * rec.clip_coef)
        grad_moved = (len(st.grads) >= MIN_READINGS
                      and abs(log_g - st.grads.median()) > math.log(GRAD_BAND))
        st.grads.add(log_g)
        if grad_moved:  # both baselines follow a gradient that settles at a new level
            st.ratios.add(x)
            st.streak, st.sign = 0, 0
            return []
        if len(st.ratios) < MIN_READINGS:
            st.ratios.add(x)
            return []
        med, sigma = st.ratios.median(), max(st.ratios.mad(), SIGMA_FLOOR)
        r = x - med
        shifted = abs(r) >= SHIFT_Z * sigma and abs(r) >= math.log(SHIFT_RATIO)
        sign = 1 if r > 0 else -1
        if not shifted:
            st.streak, st.sign = 0, 0
            st.ratios.add(x)
            return []
        st.streak = st.streak + 1 if sign == st.sign else 1
        st.sign = sign
        if st.streak < SHIFT_READINGS or not self.due(rec):
            return []
        usual = math.exp(med)
        word = "amplifies" if sign > 0 else "damps"
        msg = (f"effective lr {fmt(eff)} (||update|| / ||clipped grad||) is "
               f"{fmt(eff / rec.lr)}x the lr {fmt(rec.lr)}, against a usual {fmt(usual)}x: "
               f"{math.exp(abs(r)):.0f}x {'above' if sign > 0 else 'below'} its median "
               f"({abs(r) / sigma:.0f} sigma) on {st.streak} layer-statistics steps in a row; "
               f"the optimizer {word} the gradient far beyond its usual ratio")
        evidence = {"effective_lr": eff, "lr": rec.lr, "ratio_to_lr": eff / rec.lr,
                    "usual_ratio_to_lr": usual, "z": abs(r) / sigma,
                    "consecutive_readings": st.streak, "limit_z": SHIFT_Z,
                    "limit_ratio": SHIFT_RATIO, "update_norm": rec.update_norm,
                    "grad_norm": rec.grad_norm, "clip_threshold": rec.clip_threshold}
        tip = EFFECTIVE_LR_AMPLIFIED if sign > 0 else EFFECTIVE_LR_DAMPED
        return [self.finding(rec, msg, value=eff, threshold=usual * rec.lr,
                             evidence=evidence, suggestions=tip)]
