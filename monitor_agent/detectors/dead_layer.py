"""``dead_layer``: a parameter got no gradient, an all-zero gradient, or an exactly zero
update for ``dead_steps`` consecutive steps (frozen, disconnected, lr 0 in its group).

Counting is vectorised over the run's layer slots; loss-scaler overflow steps are skipped
(nothing updates there by design). One finding per dead layer, at most
``max_layer_findings`` per record; when every parameter is dead, one run-level finding.

A head left out of the graph: no gradient on any of 20 steps, while the body trains::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> layers = {"body.weight": {"grad_norm": 1.0, "update_norm": 0.01},
    ...           "head.weight": {"grad_none": True}}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "layers": layers}) for s in range(1, 31)]
    >>> [(f.type, f.step, f.layer, f.message) for rec in steps for f in suite.update(rec)]
    [('dead_layer', 20, 'head.weight', 'head.weight got no gradient for 20 steps')]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.advice import NOT_LEARNING
from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.slots import grown
from monitor_agent.detectors.support.stats import amp_overflow
from monitor_agent.records.types import Finding, LayerTable, Severity, StepRecord

DEAD_LAYER = (
    "Check the parameter is in the optimizer and its param group's lr is not 0.",
    "Check it is connected to the loss (no detach(), not left out of forward, requires_grad).",
    "For ReLU layers with all-zero gradients: dead units, lower the lr or use LeakyReLU/GELU.",
)


class DeadLayerSettings(SharedSettings):
    """The knobs of ``dead_layer`` (``detectors:`` in the sidecar's config)."""

    dead_steps: int = Field(
        default=20, ge=1,
        description="Consecutive steps of zero gradient or zero update: dead layer.",
    )


@dataclass(slots=True)
class DeadState:
    runs: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class DeadLayerDetector(DetectorBase[DeadLayerSettings]):
    """Warning per parameter with ``dead_steps`` consecutive zero-gradient/zero-update steps."""

    type = "dead_layer"
    severity = Severity.WARNING
    settings_model = DeadLayerSettings

    def new_rank(self) -> DeadState:
        return DeadState()

    def on_step(self, rec: StepRecord, st: DeadState) -> list[Finding]:
        if rec.layers is None or amp_overflow(rec):
            return []
        view = self.ctx.align(rec.layers)
        t = rec.layers
        dead = t.grad_none.copy()
        dead |= (t.stats["grad_norm"] == 0) & t.measured["grad_norm"]
        dead |= (t.stats["update_norm"] == 0) & t.measured["update_norm"]
        st.runs = grown(st.runs, view.size, 0)
        runs = st.runs[view.slots]
        runs = np.where(dead, runs + 1, 0)
        st.runs[view.slots] = runs
        hits = np.flatnonzero(runs >= self.settings.dead_steps)
        if not len(hits):
            return []
        if len(hits) == len(t):
            return self._all_dead(rec, int(runs.min()))
        return self._per_layer(rec, t, hits, runs)

    def _reason(self, t: LayerTable, c: int) -> str:
        if t.grad_none[c]:
            return "no gradient"
        if t.stats["grad_norm"][c] == 0:
            return "an all-zero gradient"
        return f"a zero update (grad norm {t.stats['grad_norm'][c]:.3g})"

    def _per_layer(self, rec: StepRecord, t: LayerTable, hits: np.ndarray, runs: np.ndarray
                   ) -> list[Finding]:
        found: list[Finding] = []
        for c in hits:
            name = t.names[c]
            if len(found) >= self.settings.max_layer_findings or not self.due(rec, name):
                continue
            msg = f"{name} got {self._reason(t, c)} for {runs[c]} steps"
            found.append(self.finding(
                rec, msg, value=float(runs[c]), threshold=self.settings.dead_steps, layer=name,
                evidence={"steps": int(runs[c]), "dead_layers": len(hits),
                          "grad_norm": float(t.stats["grad_norm"][c])},
                suggestions=DEAD_LAYER,
            ))
        return found

    def _all_dead(self, rec: StepRecord, steps: int) -> list[Finding]:
        if not self.due(rec):
            return []
        msg = f"no parameter changed for {steps} steps (lr {rec.lr})"
        return [self.finding(rec, msg, value=float(steps), threshold=self.settings.dead_steps,
                             evidence={"steps": steps, "lr": rec.lr},
                             suggestions=NOT_LEARNING)]
