"""``dead_layer``: a parameter got no gradient, an all-zero gradient, or an exactly zero
update for ``dead_steps`` consecutive steps (frozen, disconnected, lr 0 in its group).

Layer statistics are measured on the client's layer-statistics steps only (every
``layer_stats_every``, 25 by default), so the steps between them neither break nor extend
a layer's stretch, and a stretch is as long as it was seen: from the first measured step
that showed the layer dead to the latest one, in steps, not in records (two readings 25
steps apart are 26 steps; one measured zero, a lone step with no update, is one step, not
``dead_steps``). Counting is vectorised over the run's layer slots; loss-scaler overflow
steps are skipped (nothing updates there by design). One finding per dead layer, at most
``max_layer_findings`` per record; when every parameter is dead, one run-level finding.

A head left out of the graph: no gradient on any of 20 steps, while the body trains::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> layers = {"body.weight": {"grad_norm": 1.0, "update_norm": 0.01},
    ...           "head.weight": {"grad_none": True}}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "layers": layers}) for s in range(1, 31)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.layer) for f in found]
    [('dead_layer', 20, 'head.weight')]
    >>> print(found[0].message)
    head.weight got no gradient at every measured step since step 1 (20 steps)
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
        description="Steps of zero gradient or zero update, from the first measured step "
                    "to the latest (steps, not readings): dead layer.",
    )


@dataclass(slots=True)
class DeadState:
    """Per layer slot: the first step of its current dead stretch (-1: none) and the last
    step it was measured dead at; the stretch is ``last - since + 1`` steps long."""

    since: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    last: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


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
        st.since = grown(st.since, view.size, -1)
        st.last = grown(st.last, view.size, -1)
        since = st.since[view.slots]
        since = np.where(dead, np.where(since >= 0, since, rec.step), -1)
        last = np.where(dead, rec.step, -1)
        st.since[view.slots], st.last[view.slots] = since, last
        steps = np.where(dead, last - since + 1, 0)
        hits = np.flatnonzero(steps >= self.settings.dead_steps)
        if not len(hits):
            return []
        if len(hits) == len(t):
            return self._all_dead(rec, int(steps.min()), int(since.max()))
        return self._per_layer(rec, t, hits, steps, since)

    def _reason(self, t: LayerTable, c: int) -> str:
        if t.grad_none[c]:
            return "no gradient"
        if t.stats["grad_norm"][c] == 0:
            return "an all-zero gradient"
        return f"a zero update (grad norm {t.stats['grad_norm'][c]:.3g})"

    def _per_layer(self, rec: StepRecord, t: LayerTable, hits: np.ndarray, steps: np.ndarray,
                   since: np.ndarray) -> list[Finding]:
        found: list[Finding] = []
        for c in hits:
            name = t.names[c]
            if len(found) >= self.settings.max_layer_findings or not self.due(rec, name):
                continue
            n, first = int(steps[c]), int(since[c])
            msg = (f"{name} got {self._reason(t, c)} at every measured step since step {first} "
                   f"({n} steps)")
            found.append(self.finding(
                rec, msg, value=float(n), threshold=self.settings.dead_steps, layer=name,
                evidence={"steps": n, "since_step": first, "dead_layers": len(hits),
                          "grad_norm": float(t.stats["grad_norm"][c])},
                suggestions=DEAD_LAYER,
            ))
        return found

    def _all_dead(self, rec: StepRecord, steps: int, since: int) -> list[Finding]:
        """Every parameter dead: the stretch they share, from the latest of their starts."""
        if not self.due(rec):
            return []
        msg = (f"no parameter changed at any measured step since step {since} ({steps} steps; "
               f"lr {rec.lr})")
        return [self.finding(rec, msg, value=float(steps), threshold=self.settings.dead_steps,
                             evidence={"steps": steps, "since_step": since, "lr": rec.lr},
                             suggestions=NOT_LEARNING)]
