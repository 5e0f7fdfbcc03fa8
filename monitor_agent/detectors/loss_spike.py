"""``loss_spike``: the loss far above its recent level, both as a multiple of its
bias-corrected EMA and as a robust (median/MAD) z-score of log(loss / EMA).

Statistic: ``r = log(loss / EMA)``, judged against the last ``baseline_window`` residuals:
a spike is ``loss / EMA >= spike_ratio`` and ``(r - median) / (MAD_TO_SIGMA * MAD) >= spike_z``.
Judging the ratio in log space against the run's own residual spread makes it scale-free:
a noisy small-batch run needs a bigger jump than a smooth one. Where single batches are
heavy-tailed (a CNN at loss 0.001 has batches at 0.05) the MAD is so wide that even a
190x batch stays under 6 sigma, so an order of magnitude, ``loss / EMA >= spike_decade``,
is a spike whatever the spread - where it is also an order of magnitude (``spike_decade``
again) above the largest ratio of the last ``baseline_window`` steps. The MAD measures the
body of the residuals, not their tail; the decade rule is there for what the body
understates, so it measures the tail directly, by its largest recent excursion. A run
whose own batches routinely reach 10-20x its EMA (a DQN's TD loss near zero: 10-17x at z
2-4, ``tests/traces/shapes`` ``h_dqn_s1``; a fine-tuned CNN's 11-14x on batches it has not
fitted yet) has no decade to spare. Why a decade over that maximum: in a healthy run each
step's residual is the largest of the last 101 one step in 101 (exchangeability); to bring
that to the 1-per-10k goal the new one must top the maximum by a factor the tail reaches
one time in 100, which for a ratio tail of power 2 (finite variance) is 10x. Measured on
the tune recordings: the decade-only steps on healthy runs (``h_dqn_s1`` 7, 3 warnings;
corpus ``h_cnn_*`` 4) all fall under it; the faults the rule exists for stand 17-36x above
their runs' largest recent ratio (``f_cnn_lr_spike_sgdm`` 65x against 1.8x,
``kept_cnn_s1`` 26x against 1.5x). The spike itself never enters the EMA before it is
judged, and MAD ignores earlier spikes in the window (the tail's maximum does not: a second
batch as large within ``baseline_window`` steps is a spike by the z-score or not at all).

Which level, in which units, is the context's one judgement
(``DetectorContext.level_units``, ``support/context.py``), shared with ``divergence``,
``plateau`` and ``overfitting``. A loss the run declared ``signed`` has no zero to take
ratios from: it is judged in its own units, ``loss - EMA`` against the last
``baseline_window`` such residuals, a spike at ``spike_z`` robust sigmas, with no ratio (a
ratio to an EMA near zero is any number). A loss with no stable level - declared
``nonstationary``, or one that went below zero with nothing declared (an RL objective) - is
not judged at all: "far above its recent level" means nothing where the level moves by
design. An actor-critic loss's noise shrinks as its policy converges, so each payoff redraw
stands 6-86 of its own recent sigmas out (``tests/traces/shapes`` tune half: 7 false
warnings on ``h_ac_s1``, 1 on ``h_acnorm_s1``; none after); a bad batch there still shows
in the gradient (``grad_explosion``) and a non-finite loss (``nan_inf``).

Its ``onset_step`` is its own step: a spike is judged on the step it happens.

A spike is a warning: one bad batch, or a burst of them, that the run recovers from. What persists is judged by
``divergence`` (the loss level holding high) and ``grad_explosion`` (the gradient staying
high), which page.

A loss around 2.0 for 59 steps, then one batch at 5.0::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "loss": 5.0 if s == 60 else 2.0 + 0.02 * (s % 3)})
    ...          for s in range(1, 61)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('loss_spike', 60, 'warning')]
    >>> print(found[0].message)
    loss 5 is 2.5x its EMA 2.02 (z=62.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, finite, robust_z
from monitor_agent.records.types import Finding, Severity, StepRecord

LOSS_SPIKE = (
    "Inspect the batch of this step (corrupted, mislabelled or out-of-distribution data).",
    "If spikes recur, lower the learning rate or enable gradient clipping.",
    "For large models: skip batches whose loss is far above the EMA, or lower Adam beta2.",
)


class LossSpikeSettings(SharedSettings):
    """The knobs of ``loss_spike`` (``detectors:`` in the sidecar's config)."""

    spike_z: float = Field(
        default=6.0, gt=0, description="Robust z (MAD) of log(loss/EMA) that makes a spike."
    )
    spike_ratio: float = Field(default=1.3, gt=1, description="loss / EMA that makes a spike.")
    spike_decade: float = Field(
        default=10.0, gt=1,
        description="loss / EMA that is a spike whatever the z-score (an order of magnitude; the "
        "z-score alone misses it where single batches are heavy-tailed), where it is also this "
        "many times the largest loss / EMA of the last baseline_window steps.",
    )


@dataclass(slots=True)
class SpikeState:
    residuals: Window
    spikes: int = 0
    lin_residuals: Window = field(default_factory=lambda: Window.of(0))  # loss - EMA


class LossSpikeDetector(DetectorBase[LossSpikeSettings]):
    """Warning when loss/EMA and the robust z of log(loss/EMA) both exceed their limits."""

    type = "loss_spike"
    severity = Severity.WARNING
    settings_model = LossSpikeSettings

    def new_rank(self) -> SpikeState:
        n = self.settings.baseline_window
        return SpikeState(residuals=Window.of(n), lin_residuals=Window.of(n))

    def on_step(self, rec: StepRecord, st: SpikeState) -> list[Finding]:
        ema, units = self.ctx.ema_loss(rec.rank), self.ctx.level_units(rec.rank)
        if units is None:
            return []  # no stable level to be far above (support/context.py)
        if finite(rec.loss) and ema is not None and units == "linear":
            return self._signed(rec, st, rec.loss, ema)
        if not finite(rec.loss) or ema is None or ema <= 0 or rec.loss <= 0:
            return []
        resid = math.log(rec.loss / ema)
        found = []
        if len(st.residuals) >= self.settings.min_history_steps:
            found = self._judge(rec, st, rec.loss, ema, resid)
        st.residuals.add(resid)
        return found

    def _signed(self, rec: StepRecord, st: SpikeState, loss: float, ema: float
                ) -> list[Finding]:
        """A loss with no zero: ``loss - EMA`` in robust sigmas of its own residuals."""
        s, resid = self.settings, loss - ema
        found: list[Finding] = []
        if len(st.lin_residuals) >= s.min_history_steps:
            z = robust_z(resid, st.lin_residuals)
            if z >= s.spike_z:
                st.spikes += 1
                if self.due(rec):
                    msg = (f"loss {fmt(loss)} is {fmt(resid)} above its EMA {fmt(ema)} "
                           f"(z={z:.1f} of its own noise; a signed loss has no ratio)")
                    evidence = {"onset_step": rec.step, "loss": loss, "ema": ema,
                                "excess": resid, "z": z, "limit_z": s.spike_z,
                                "units": "linear", "grad_norm": rec.grad_norm,
                                "spikes_so_far": st.spikes}
                    found = [self.finding(rec, msg, value=loss, threshold=ema,
                                          evidence=evidence, suggestions=LOSS_SPIKE)]
        st.lin_residuals.add(resid)
        return found

    def _decade(self, st: SpikeState, resid: float) -> bool:
        """An order of magnitude above the EMA and above the largest ratio of the run's last
        ``baseline_window`` steps (its own tail; module docstring)."""
        decade = math.log(self.settings.spike_decade)
        tail = max(float(st.residuals.values().max()), 0.0)
        return resid >= decade + tail

    def _judge(self, rec: StepRecord, st: SpikeState, loss: float, ema: float, resid: float
               ) -> list[Finding]:
        s = self.settings
        ratio = loss / ema
        z = robust_z(resid, st.residuals, floor=1e-3)
        if ratio < s.spike_ratio or (z < s.spike_z and not self._decade(st, resid)):
            return []
        st.spikes += 1
        if not self.due(rec):
            return []
        msg = f"loss {fmt(rec.loss)} is {ratio:.1f}x its EMA {fmt(ema)} (z={z:.1f})"
        evidence = {"onset_step": rec.step, "loss": rec.loss, "ema": ema, "ratio": ratio, "z": z,
                    "limit_ratio": s.spike_ratio, "limit_z": s.spike_z,
                    "grad_norm": rec.grad_norm, "spikes_so_far": st.spikes}
        return [self.finding(rec, msg, value=rec.loss, threshold=ema, evidence=evidence,
                             suggestions=LOSS_SPIKE)]
