"""``loss_scale_collapse``: the mixed-precision loss scale falling repeatedly, to its floor,
or overflowing on many consecutive steps.

A dynamic loss scaler halves its scale on an overflow and skips that optimizer step; a few
of those are the scaler probing (especially in its own warmup) and are only counted. Once
the scaler has run ``loss_scale_settle_steps`` clean steps, a scale
``loss_scale_halvings`` halvings below its recent maximum, a scale under
``loss_scale_floor``, or ``loss_scale_max_skipped`` skipped steps in a row is a collapse.

Where the overflows start: on a skipped step the client sends the per-parameter norms of
the unscaled gradients; the first non-finite one in backward order (output side first) of
the latest overflow is named (``overflow_origin``), a layer that overflows on its own.

Twenty clean fp16 steps at a scale of 65536, then overflow after overflow, each skipped and
halving the scale, the output head's unscaled gradient the first non-finite one::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> overflow = {"grad_norm": "Infinity", "skipped": True,
    ...             "grad_norms": {"blocks.0.weight": 1.0, "lm_head.weight": "Infinity"}}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s, "loss": 2.0,
    ...                        "loss_scale": 65536.0 / 2 ** max(0, s - 20),
    ...                        **({"grad_norm": 1.0} if s <= 20 else overflow)})
    ...          for s in range(1, 31)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label, f.evidence["overflow_origin"]) for f in found]
    [('loss_scale_collapse', 26, 'error', 'lm_head.weight')]
    >>> print(found[0].message)
    loss scale 1.02e+03 is 6 halvings below its recent 6.55e+04 (at least 6 halvings); 6 steps
    skipped so far; the latest overflow's first non-finite gradient (output side): lm_head.weight
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.nonfinite import nonfinite_params
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.stats import Window, amp_overflow, finite
from monitor_agent.records.types import Finding, Severity, StepRecord

LOSS_SCALE = (
    "The fp16 loss scale is collapsing: switch to bfloat16 autocast (no loss scaling needed).",
    "Lower the learning rate; persistent overflow often means the model is diverging.",
    "Check for ops that overflow in fp16 (large logits, exp, unscaled attention).",
)


class LossScaleCollapseSettings(SharedSettings):
    """The knobs of ``loss_scale_collapse`` (``detectors:`` in the sidecar's config)."""

    loss_scale_halvings: int = Field(
        default=6, ge=1, description="Loss scale this many halvings below its recent max: collapse."
    )
    loss_scale_floor: float = Field(
        default=1.0, gt=0,
        description="Loss scale below this: collapse.",
    )
    loss_scale_max_skipped: int = Field(
        default=10, ge=1, description="Consecutive skipped (overflow) steps that are a collapse."
    )
    loss_scale_settle_steps: int = Field(
        default=20, ge=1, description="Non-skipped steps before the scaler's own warmup is over."
    )


@dataclass(slots=True)
class ScaleState:
    scales: Window
    settled: bool = False
    clean: int = 0
    consecutive_skipped: int = 0
    skipped_total: int = 0
    overflow_origin: str | None = None  # first non-finite unscaled grad, latest overflow


class LossScaleCollapseDetector(DetectorBase[LossScaleCollapseSettings]):
    """Error when the loss scale collapses (see module docstring)."""

    type = "loss_scale_collapse"
    severity = Severity.ERROR
    settings_model = LossScaleCollapseSettings

    def new_rank(self) -> ScaleState:
        return ScaleState(scales=Window.of(self.settings.baseline_window))

    def on_step(self, rec: StepRecord, st: ScaleState) -> list[Finding]:
        scale = rec.loss_scale
        if not finite(scale):
            return []
        self._count(rec, st)
        peak = float(max(st.scales.values())) if len(st.scales) else scale
        if st.settled:
            st.scales.add(scale)
        reason = self._reason(st, scale, peak)
        if reason is None or not self.due(rec):
            return []
        halvings = math.log2(peak / scale) if scale > 0 and peak > 0 else math.inf
        msg = (f"loss scale {fmt(scale)} is {halvings:.0f} halvings below its recent "
               f"{fmt(peak)} ({reason}); {st.skipped_total} steps skipped so far")
        if st.overflow_origin is not None:
            msg += (f"; the latest overflow's first non-finite gradient (output side): "
                    f"{st.overflow_origin}")
        evidence = {"overflow_origin": st.overflow_origin, "loss_scale": scale,
                    "recent_max": peak, "halvings": halvings,
                    "skipped_total": st.skipped_total,
                    "consecutive_skipped": st.consecutive_skipped, "loss": rec.loss}
        return [self.finding(rec, msg, value=scale, threshold=peak, evidence=evidence,
                             suggestions=LOSS_SCALE)]

    def _count(self, rec: StepRecord, st: ScaleState) -> None:
        if amp_overflow(rec) and rec.skip_reason in (None, "loss_scale"):  # not a guard skip
            bad = nonfinite_params(self.ctx, rec)
            if bad:
                st.overflow_origin = bad[0]
            st.skipped_total += 1
            st.consecutive_skipped += 1
            st.clean = 0
            return
        st.consecutive_skipped = 0
        st.clean += 1
        if st.clean >= self.settings.loss_scale_settle_steps:
            st.settled = True

    def _reason(self, st: ScaleState, scale: float, peak: float) -> str | None:
        s = self.settings
        if scale < s.loss_scale_floor:
            return f"below the floor {fmt(s.loss_scale_floor)}"
        if st.consecutive_skipped >= s.loss_scale_max_skipped:
            return f"{st.consecutive_skipped} overflow steps in a row"
        if st.settled and scale <= peak / 2**s.loss_scale_halvings:
            return f"at least {s.loss_scale_halvings} halvings"
        return None
