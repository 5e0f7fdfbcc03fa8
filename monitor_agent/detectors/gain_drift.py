"""``gain_drift``: the gradient's amplification from layer to layer creeping upward.

Per step, the per-layer gain is ``exp(-slope)`` of log grad norm against depth (input to
output, from ``layer_order``), a least-squares fit over every parameter so no single
noisy parameter decides it; gain > 1 means gradients grow toward the input. The baseline
is its median over the first ``gain_window`` steps after warmup; the finding fires when
the median of the last ``gain_window`` steps exceeds the baseline by the depth-scaled
limit ``1 + gain_drift_coef * sqrt(L)`` and the drift compounded over the depth (input vs
output) reaches ``gain_drift_min_total``, so a shallow net's noise never fires.

And the whole gradient must have grown: the norm over all layers (recent median over
baseline median, same windows) at least ``gain_drift_norm_growth`` (3x, the
``explosion_ratio`` floor). Measured on the 44 healthy runs of ``tests/traces/corpus``, the
input-vs-output gain of a healthy MLP, ViT or GPT moves 4x to 100x during ordinary training
as the gradient redistributes between layers at a near-constant total; what makes a drift a
problem is the input-side gradients growing the total, on the way to an explosion.

Severity info: even with both conditions, healthy MLPs trained from a fresh init grow their
gradient 3-6x while the gain shifts (measured on the corpus' tuning half), so a drift is
context shown beside the run, not an alarm; ``grad_explosion`` pages when the gradient
actually blows up. The baseline starts ``baseline_window`` steps after warmup, past the
transient of the first steps from initialisation. A run that watches several models (a GAN) is judged on
its deepest model's layers: depth orders one model's layers, not two models'.

Sixteen layers whose gradient starts growing 1.25x per layer toward the input at step 31
(the windows shortened to 10 steps, the run without warmup)::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings(gain_window=10, baseline_window=10))
    >>> names = [f"blocks.{k}.weight" for k in range(16)]
    >>> run = parse_record({"kind": "run", "run_id": "r", "config": {"warmup_steps": 0},
    ...                     "model": {"layer_order": names}})
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "layers": {
    ...     n: {"grad_norm": (1.0 if s <= 30 else 1.25) ** (15 - k)} for k, n in enumerate(names)}})
    ...     for s in range(1, 41)]
    >>> found = [f for rec in [run, *steps] for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label) for f in found]
    [('gain_drift', 36, 'info')]
    >>> print(found[0].message)
    per-layer gradient gain 1.250 is 1.25x its early 1.000 (limit 1.20x for 16 layers; 28x input
    vs output) and the gradient norm grew 11.8x
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, slope
from monitor_agent.records.types import Finding, Severity, StepRecord

GAIN_DRIFT = (
    "The gradient's amplification through depth is creeping up: watch for explosion; "
    "consider lower lr, gradient clipping or stronger normalisation.",
    "Check residual branch scaling (e.g. 1/sqrt(2*n_layers) init of output projections).",
)


class GainDriftSettings(SharedSettings):
    """The knobs of ``gain_drift`` (``detectors:`` in the sidecar's config)."""

    gain_drift_coef: float = Field(
        default=0.05, gt=0, description="Per-layer gain drift limit is 1 + coef * sqrt(n_layers)."
    )
    gain_drift_min_total: float = Field(
        default=4.0, gt=1,
        description="End-to-end (input vs output) gain change it must also reach...",
    )
    gain_drift_norm_growth: float = Field(
        default=3.0, gt=1, description="...and the whole gradient (norm over all layers) must have "
        "grown this much from the baseline to the recent median."
    )
    gain_window: int = Field(
        default=50, ge=5, description="Steps in the baseline and current gain medians."
    )


@dataclass(slots=True)
class GainState:
    recent: Window
    baseline_values: Window
    recent_norm: Window
    baseline_norms: Window
    baseline: float | None = None
    baseline_norm: float | None = None


class GainDriftDetector(DetectorBase[GainDriftSettings]):
    """Info when the per-layer backward gain grew past the depth-scaled limit."""

    type = "gain_drift"
    severity = Severity.INFO  # context for grad_explosion, never an alarm on its own
    settings_model = GainDriftSettings

    def new_rank(self) -> GainState:
        w = self.settings.gain_window
        return GainState(recent=Window.of(w), baseline_values=Window.of(w),
                         recent_norm=Window.of(w), baseline_norms=Window.of(w))

    def on_step(self, rec: StepRecord, st: GainState) -> list[Finding]:
        settle = self.ctx.warmup + self.settings.baseline_window
        if rec.layers is None or amp_overflow(rec) or rec.step <= settle:
            return []
        view = self.ctx.align(rec.layers)
        # A run of several models: the deepest one's gain (depth orders one model's layers).
        g = rec.layers.stats["grad_norm"][max(view.models(), key=len)]
        if len(g) < 3 or not (np.isfinite(g).all() and (g > 0).all()):
            return []
        log_gain = -slope(np.log(g))
        log_norm = 0.5 * math.log(float(np.sum(g * g)))
        if st.baseline is None:
            st.baseline_values.add(log_gain)
            st.baseline_norms.add(log_norm)
            if st.baseline_values.full:
                st.baseline = st.baseline_values.median()
                st.baseline_norm = st.baseline_norms.median()
            return []
        st.recent.add(log_gain)
        st.recent_norm.add(log_norm)
        if not st.recent.full:
            return []
        return self._judge(rec, st, len(g), st.baseline)

    def _judge(self, rec: StepRecord, st: GainState, depth: int, baseline: float
               ) -> list[Finding]:
        drift = math.exp(st.recent.median() - baseline)
        limit = 1.0 + self.settings.gain_drift_coef * math.sqrt(depth)
        total = drift ** (depth - 1)
        growth = math.exp(st.recent_norm.median() - (st.baseline_norm or 0.0))
        if (drift <= limit or total < self.settings.gain_drift_min_total
                or growth < self.settings.gain_drift_norm_growth or not self.due(rec)):
            return []
        now, base = math.exp(st.recent.median()), math.exp(baseline)
        msg = (f"per-layer gradient gain {now:.3f} is {drift:.2f}x its early {base:.3f} "
               f"(limit {limit:.2f}x for {depth} layers; {total:.0f}x input vs output) and "
               f"the gradient norm grew {growth:.1f}x")
        evidence = {"gain": now, "baseline_gain": base, "drift": drift, "layers": depth,
                    "end_to_end_drift": total, "grad_norm_growth": growth}
        return [self.finding(rec, msg, value=drift, threshold=limit, evidence=evidence,
                             suggestions=GAIN_DRIFT)]
