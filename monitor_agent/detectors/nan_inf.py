"""``nan_inf``: the loss, the gradient norm or a parameter statistic is NaN or infinite.

Mixed precision is respected: on a step the loss scaler skipped (``skipped`` or a finite
loss with an infinite gradient under a loss scale) the non-finite gradient is the scaler
working, not a fault. The suggestion depends on what preceded the NaN.

``non_finite`` is the rule itself, a pure function of one record: the detector applies it
to every step in order, and the sidecar's preview route (api/preview.py) applies it, via
``NanInfDetector.preview``, to a NaN step that arrives ahead of its backlog, so the page
need not wait for the history to be replayed.

Example::

    det = NanInfDetector(DetectorSettings(), RunContext(DetectorSettings()))
    det.update(StepRecord(run_id="r", step=5, time=0.0, loss=float("nan")))  # -> [critical]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from monitor_agent import suggestions as tips
from monitor_agent.detectors.common import DetectorBase
from monitor_agent.detectors.stats import Window, finite
from monitor_agent.types import EvalRecord, Finding, StepRecord

_GLOBAL_FIELDS = ("loss", "grad_norm", "param_norm", "update_norm")
_LAYER_STATS = ("grad_norm", "param_norm", "update_norm")


@dataclass(slots=True)
class NanState:
    grads: Window = field(default_factory=lambda: Window.of(50))
    streak: int = 0  # consecutive steps with a non-finite value


def amp_overflow(rec: StepRecord) -> bool:
    """A loss-scaler overflow step: the optimizer skipped it; inf grads are expected."""
    if rec.skipped:
        return True
    return rec.loss_scale is not None and finite(rec.loss) and not finite(rec.grad_norm)


def non_finite(rec: StepRecord) -> tuple[list[str], np.ndarray | None]:
    """What makes ``rec`` a nan_inf finding: its non-finite global fields, and a mask of the
    layers with a non-finite measured statistic (None when there are none). On an AMP
    overflow step only a non-finite loss counts: inf gradients are the scaler working."""
    overflow = amp_overflow(rec)
    bad = [f for f in _GLOBAL_FIELDS if _nonfinite(getattr(rec, f))]
    if overflow:
        return [f for f in bad if f == "loss"], None
    if rec.layers is None:
        return bad, None
    mask = np.zeros(len(rec.layers), dtype=bool)
    for stat in _LAYER_STATS:
        mask |= ~np.isfinite(rec.layers.stats[stat]) & rec.layers.measured[stat]
    return bad, mask if mask.any() else None


class NanInfDetector(DetectorBase):
    """Critical finding on the first non-finite value, then at most every N steps.

    One more when the run is still non-finite ``nan_persist_steps`` steps in a row: that
    second finding is what a rule's ``action: stop, action_after: 2`` waits for, so one
    bad batch that the run recovers from does not stop it.
    """

    type = "nan_inf"

    def new_rank(self) -> NanState:
        return NanState()

    def on_step(self, rec: StepRecord, st: NanState) -> list[Finding]:
        bad, mask = non_finite(rec)
        layers = self._bad_layers(rec, mask)
        if not bad and not layers:
            st.streak = 0
            if finite(rec.grad_norm) and rec.grad_norm > 0:
                st.grads.add(math.log(rec.grad_norm))
            return []
        st.streak += 1
        persisting = st.streak == self.settings.nan_persist_steps
        if not persisting and not self.due(rec):  # the milestone leaves the repeat clock be
            return []
        return [self._finding(rec, st, bad, layers)]

    def preview(self, rec: StepRecord) -> Finding | None:
        """The finding ``rec`` would bring were it the rank's next step, changing no state
        (neither the streak, nor the repeat clock, nor the run context); None when it is
        not non-finite. For a page ahead of a backlog: the in-order copy of ``rec`` is
        judged by ``update`` when it arrives, and that finding is the one stored.

        Only a non-finite global field (loss, norms) is previewed: a finding about layers
        alone names its layer in depth order, which needs the run's layer context, and
        the alert's identity may include that layer."""
        bad, mask = non_finite(rec)
        if not bad:
            return None
        layers = [rec.layers.names[c] for c in np.flatnonzero(mask)] if mask is not None else []
        st = self.ranks.get(rec.rank) or self.new_rank()
        ahead = NanState(grads=st.grads, streak=st.streak + 1)  # read only: a shallow copy
        return self._finding(rec, ahead, bad, layers)

    def on_eval(self, rec: EvalRecord, st: NanState) -> list[Finding]:
        if not _nonfinite(rec.val_loss) or not self.due(rec):
            return []
        msg = f"val_loss is {rec.val_loss} at step {rec.step}"
        return [self.finding(rec, msg, value=rec.val_loss, suggestions=tips.NAN_SUDDEN)]

    def _bad_layers(self, rec: StepRecord, mask: np.ndarray | None) -> list[str]:
        """Names of the masked layers, in depth order."""
        if mask is None or rec.layers is None:
            return []
        view = self.ctx.align(rec.layers)
        ordered = [int(c) for c in view.order if mask[c]]
        rest = [int(c) for c in np.flatnonzero(mask) if c not in set(ordered)]
        return [rec.layers.names[c] for c in ordered + rest]

    def _finding(
        self, rec: StepRecord, st: NanState, bad: list[str], layers: list[str]
    ) -> Finding:
        parts = [f"{f} is {getattr(rec, f)}" for f in bad]
        if layers:
            parts.append(f"{len(layers)} parameter(s) non-finite, first {layers[0]}")
        growth = self._growth(st)
        evidence = {"non_finite_fields": ",".join(bad), "non_finite_layers": len(layers),
                    "consecutive_steps": st.streak,
                    "first_layer": layers[0] if layers else None, "grad_norm_growth": growth}
        return self.finding(
            rec, "; ".join(parts) + f" at step {rec.step}",
            value=rec.loss if "loss" in bad else rec.grad_norm,
            evidence=evidence, suggestions=self._suggest(rec, growth),
            layer=layers[0] if layers and not bad else None,
        )

    def _growth(self, st: NanState) -> float | None:
        """Last finite grad norm over the median of the ones before it."""
        if len(st.grads) < 5:
            return None
        values = st.grads.values()
        return float(np.exp(values[-3:].max() - np.median(values[:-3])))

    def _suggest(self, rec: StepRecord, growth: float | None) -> tuple[str, ...]:
        info = self.ctx.state.ranks.get(str(rec.rank))  # read only (preview changes nothing)
        if info is None or info.steps < self.settings.min_history_steps:
            return tips.NAN_AT_START
        if growth is not None and growth >= 3.0:
            return tips.NAN_AFTER_GROWTH
        if rec.loss_scale is not None:
            return tips.NAN_FP16 + tips.NAN_SUDDEN
        return tips.NAN_SUDDEN


def _nonfinite(x: float | None) -> bool:
    return x is not None and not math.isfinite(x)
