"""``dead_units``: a ReLU-family module whose units stopped firing.

Reads the ``dead_frac`` of each module in a step's ``activations`` (units exactly zero for
every sample of the batch; null for non-ReLU modules, which are ignored). A reading is dead
when the fraction is at least ``dead_unit_ratio`` or at least ``dead_unit_rise`` above the
module's own early level (the mean of its first ``min_activation_readings`` readings: a
small batch leaves some units silent even in a healthy net). ``dead_unit_readings``
consecutive dead readings make a warning for that module. Vectorised over modules.

A ReLU whose dead fraction jumps from 5% to 92% after its five early readings (the GELU
module, whose ``dead_frac`` is null, is ignored)::

    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> def activations(s):
    ...     return {"mlp.1": {"std": 1.0, "max_abs": 3.0, "dead_frac": 0.05 if s <= 5 else 0.92},
    ...             "mlp.3": {"std": 1.0, "max_abs": 2.0, "dead_frac": None}}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "activations": activations(s)}) for s in range(1, 11)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.layer) for f in found]
    [('dead_units', 8, 'mlp.1')]
    >>> print(found[0].message)
    mlp.1: 92% of units dead (zero for the whole batch), 5% early in the run
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.slots import ModuleSlots, grown
from monitor_agent.records.types import Finding, Severity, StepRecord

DEAD_UNITS = (
    "Lower the learning rate or lengthen warmup: a large update pushed the pre-activations "
    "below zero for every input, and dead ReLUs get no gradient to come back.",
    "Check the biases and the input scale of the layer before it (a large negative shift "
    "kills units); re-initialise or normalise (LayerNorm/BatchNorm) before the activation.",
    "Use LeakyReLU, GELU or SiLU, which keep a gradient below zero.",
)


class DeadUnitsSettings(SharedSettings):
    """The knobs of ``dead_units`` (``detectors:`` in the sidecar's config)."""

    dead_unit_ratio: float = Field(
        default=0.5, gt=0, le=1,
        description="A ReLU module's dead-unit fraction at or above this...",
    )
    dead_unit_rise: float = Field(
        default=0.3, gt=0, le=1,
        description="...or this much above its own early level (mean of its first "
        "min_activation_readings readings) is dead_units.",
    )
    dead_unit_readings: int = Field(
        default=3, ge=1, description="Consecutive readings a module must stay dead to be reported."
    )


@dataclass(slots=True)
class DeadUnitsState:
    slots: ModuleSlots = field(default_factory=ModuleSlots)
    early_sum: np.ndarray = field(default_factory=lambda: np.zeros(0))
    early_n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    streak: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class DeadUnitsDetector(DetectorBase[DeadUnitsSettings]):
    """Warning per module dead for ``dead_unit_readings`` readings in a row."""

    type = "dead_units"
    severity = Severity.WARNING
    settings_model = DeadUnitsSettings

    def new_rank(self) -> DeadUnitsState:
        return DeadUnitsState()

    def on_step(self, rec: StepRecord, st: DeadUnitsState) -> list[Finding]:
        table = rec.activations
        if table is None:
            return []
        cols, slots = st.slots.align(table.names)
        size = len(st.slots)
        st.early_sum, st.early_n = grown(st.early_sum, size, 0.0), grown(st.early_n, size, 0)
        st.streak = grown(st.streak, size, 0)
        dead = table.stats["dead_frac"][cols]
        ok = np.isfinite(dead)
        cols, slots, dead = cols[ok], slots[ok], dead[ok]
        early = self._early(st, slots, dead)
        s = self.settings
        hit = (dead >= s.dead_unit_ratio) | (np.isfinite(early) & (dead >= early + s.dead_unit_rise))
        st.streak[slots] = np.where(hit, st.streak[slots] + 1, 0)
        found: list[Finding] = []
        for k in np.flatnonzero(st.streak[slots] >= s.dead_unit_readings):
            if len(found) >= s.max_layer_findings:
                break
            name = table.names[cols[k]]
            if self.due(rec, name):
                found.append(self._finding(rec, name, dead[k], early[k], st.streak[slots[k]]))
        return found

    def _early(self, st: DeadUnitsState, slots: np.ndarray, dead: np.ndarray) -> np.ndarray:
        """The early level of each module (NaN until it has one), folding this reading in
        while the module is still in its early readings."""
        need = self.settings.min_activation_readings
        n = st.early_n[slots]
        with np.errstate(invalid="ignore", divide="ignore"):
            early = np.where(n >= need, st.early_sum[slots] / np.maximum(n, 1), np.nan)
        young = n < need
        st.early_sum[slots[young]] += dead[young]
        st.early_n[slots[young]] += 1
        return early

    def _finding(self, rec: StepRecord, name: str, dead: float, early: float,
                 readings: int) -> Finding:
        base = "" if not np.isfinite(early) else f", {early:.0%} early in the run"
        msg = f"{name}: {dead:.0%} of units dead (zero for the whole batch){base}"
        s = self.settings
        limit = min(s.dead_unit_ratio, early + s.dead_unit_rise) if np.isfinite(early) \
            else s.dead_unit_ratio
        return self.finding(
            rec, msg, value=float(dead), threshold=float(limit), layer=name,
            evidence={"dead_frac": float(dead), "early_dead_frac": float(early),
                      "readings": int(readings), "lr": rec.lr},
            suggestions=DEAD_UNITS)
