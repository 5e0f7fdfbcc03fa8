"""``grad_explosion``: the global gradient norm an order of magnitude above its rolling
median, or one parameter's gradient norm far above its own history.

Warmup-aware: while the learning rate warms up, large gradient norms are normal, so the
limit is multiplied by ``explosion_warmup_factor``. Overflow steps of a loss scaler are
not gradients and are skipped.

Example::

    det = GradExplosionDetector(settings, ctx)
    det.update(step)   # -> [Finding(type="grad_explosion", message="grad norm 932 is 2320x ...")]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from monitor_agent import suggestions as tips
from monitor_agent.detectors.common import DetectorBase, fmt
from monitor_agent.detectors.layer_stats import LayerEma
from monitor_agent.detectors.nan_inf import amp_overflow
from monitor_agent.detectors.stats import Window, finite
from monitor_agent.types import Finding, StepRecord

LAYER_ALPHA = 0.95  # per-layer baseline: about the last 20 steps


@dataclass(slots=True)
class ExplosionState:
    grads: Window
    layers: LayerEma = field(default_factory=LayerEma)


class GradExplosionDetector(DetectorBase):
    """Error when the grad norm is ``explosion_ratio`` x its median (global or per layer)."""

    type = "grad_explosion"

    def new_rank(self) -> ExplosionState:
        return ExplosionState(grads=Window.of(self.settings.baseline_window))

    def on_step(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        if amp_overflow(rec):
            return []
        found = self._global(rec, st)
        if not found and rec.layers is not None:
            found = self._per_layer(rec, st)
        elif rec.layers is not None:
            self._fold_layers(rec, st)
        return found

    def _global(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        if not finite(rec.grad_norm) or rec.grad_norm <= 0:
            return []
        found = []
        if len(st.grads) >= self.settings.min_history_steps:
            found = self._judge(rec, st)
        st.grads.add(math.log(rec.grad_norm))
        return found

    def _limit(self, rec: StepRecord) -> float:
        s = self.settings
        warm = self.ctx.in_warmup(rec.step)
        return s.explosion_ratio * (s.explosion_warmup_factor if warm else 1.0)

    def _judge(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        median = math.exp(st.grads.median())
        ratio, limit = rec.grad_norm / median, self._limit(rec)
        if ratio < limit or not self.due(rec):
            return []
        msg = f"grad norm {fmt(rec.grad_norm)} is {ratio:.0f}x its median {fmt(median)}"
        evidence = {"grad_norm": rec.grad_norm, "median": median, "ratio": ratio,
                    "limit_ratio": limit, "in_warmup": self.ctx.in_warmup(rec.step),
                    "lr": rec.lr, "loss": rec.loss}
        return [self.finding(rec, msg, value=rec.grad_norm, threshold=median * limit,
                             evidence=evidence, suggestions=tips.GRAD_EXPLOSION)]

    def _fold_layers(self, rec: StepRecord, st: ExplosionState) -> np.ndarray:
        view = self.ctx.align(rec.layers)
        with np.errstate(divide="ignore", invalid="ignore"):
            logs = np.log(rec.layers.stats["grad_norm"])
        logs = np.where(np.isfinite(logs), logs, np.nan)
        before = st.layers.value(view.slots, LAYER_ALPHA, view.size)
        count = st.layers.count(view.slots, view.size)
        st.layers.add(view.slots, logs, LAYER_ALPHA, view.size)
        ratio = np.exp(logs - before)
        ratio[(count < self.settings.min_history_steps) | ~np.isfinite(ratio)] = 0.0
        return ratio

    def _per_layer(self, rec: StepRecord, st: ExplosionState) -> list[Finding]:
        ratio = self._fold_layers(rec, st)
        limit = self.settings.layer_explosion_ratio * (
            self.settings.explosion_warmup_factor if self.ctx.in_warmup(rec.step) else 1.0
        )
        hits = np.flatnonzero(ratio >= limit)
        found = []
        for c in hits[np.argsort(-ratio[hits])][: self.settings.max_layer_findings]:
            name = rec.layers.names[c]
            if not self.due(rec, name):
                continue
            g = float(rec.layers.stats["grad_norm"][c])
            msg = f"{name}: grad norm {fmt(g)} is {ratio[c]:.0f}x its recent level"
            found.append(self.finding(
                rec, msg, value=g, threshold=g / ratio[c] * limit, layer=name,
                evidence={"ratio": float(ratio[c]), "limit_ratio": limit},
                suggestions=tips.GRAD_EXPLOSION,
            ))
        return found
