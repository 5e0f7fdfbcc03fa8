"""``activation_blowup``: a module's outputs went non-finite, or grew many times over.

Two conditions on a step's ``activations`` (error, as it precedes attention-logit and loss
divergence):

* non-finite: any module reports NaN/Inf entries (``nonfinite`` > 0, or a non-finite
  max-abs/std): one finding naming the first such module, at once;
* growth: a module's max-abs or std is ``activation_blowup_ratio`` x the median of its own
  last ``activation_window`` readings AND ``activation_blowup_z`` robust deviations (MAD)
  above it, both in log space (scale-free: a 1e-3 and a 1e3 activation are judged alike),
  for ``activation_blowup_readings`` consecutive readings.

Every reading joins the baseline (the median shrugs off a few outliers, and a legitimate
lasting level change stops being news). Vectorised over modules.

Ten steps with every max-abs near 20, then one MLP's max-abs at 800 on two in a row::

    >>> import math
    >>> from monitor_agent.detectors import DetectorSettings, DetectorSuite
    >>> from monitor_agent.records.schemas import parse_record
    >>> suite = DetectorSuite(DetectorSettings())
    >>> def activations(s):
    ...     usual = 20.0 * (1 + 0.1 * math.sin(s))
    ...     return {"h.3.attn": {"std": 1.0, "max_abs": usual},
    ...             "h.3.mlp.act": {"std": 1.0, "max_abs": usual if s <= 10 else 800.0}}
    >>> steps = [parse_record({"kind": "step", "run_id": "r", "step": s, "time": s,
    ...                        "activations": activations(s)}) for s in range(1, 13)]
    >>> found = [f for rec in steps for f in suite.update(rec)]
    >>> [(f.type, f.step, f.severity.label, f.layer) for f in found]
    [('activation_blowup', 12, 'error', 'h.3.mlp.act')]
    >>> print(found[0].message)
    h.3.mlp.act: activation max-abs 800 is 38x its recent median 20.8 for 2 readings
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from pydantic import Field

from monitor_agent.detectors.support.common import DetectorBase, fmt
from monitor_agent.detectors.support.shared_settings import SharedSettings
from monitor_agent.detectors.support.slots import ModuleSlots, grown
from monitor_agent.detectors.support.stats import MAD_TO_SIGMA
from monitor_agent.records.types import ActivationTable, Finding, Severity, StepRecord

STATS = ("max_abs", "std")
LOG_FLOOR = 0.05  # MAD floor in log space (5%): a flat history must not make noise a z of 100


ACTIVATION_BLOWUP = (
    "Lower the learning rate (2-10x) or enable gradient clipping: activations growing by "
    "orders of magnitude precede attention-logit and loss divergence.",
    "Add or check normalisation (pre-LayerNorm, QK-norm, logit soft-capping) and weight decay "
    "on the layers feeding this module.",
    "Check the initialisation scale of the layers feeding it, and restart from the last good "
    "checkpoint if values already reached inf/NaN.",
)


class ActivationBlowupSettings(SharedSettings):
    """The knobs of ``activation_blowup`` (``detectors:`` in the sidecar's config)."""

    activation_blowup_ratio: float = Field(
        default=10.0, gt=1,
        description="A module's max-abs or std this many times the median of its own recent "
        "readings (log space) is growing...",
    )
    activation_blowup_z: float = Field(
        default=6.0, gt=0, description="...and at least this many robust (MAD) deviations above it."
    )
    activation_blowup_readings: int = Field(
        default=2, ge=1, description="Consecutive growing readings that make activation_blowup."
    )
    activation_window: int = Field(
        default=20, ge=3, description="Readings in each module's rolling median/MAD baseline."
    )


@dataclass(slots=True)
class BlowupState:
    slots: ModuleSlots = field(default_factory=ModuleSlots)
    hist: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # slot, stat*window
    n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    streak: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


class ActivationBlowupDetector(DetectorBase[ActivationBlowupSettings]):
    """Error on non-finite activations or on sustained growth far above their history."""

    type = "activation_blowup"
    severity = Severity.ERROR
    settings_model = ActivationBlowupSettings

    def new_rank(self) -> BlowupState:
        w = self.settings.activation_window
        return BlowupState(hist=np.zeros((0, len(STATS) * w)))

    def on_step(self, rec: StepRecord, st: BlowupState) -> list[Finding]:
        table = rec.activations
        if table is None:
            return []
        cols, slots = st.slots.align(table.names)
        size = len(st.slots)
        w2 = len(STATS) * self.settings.activation_window
        st.hist = grown(st.hist.reshape(-1, w2), size, np.nan)  # restored empty: 1-D
        st.n, st.streak = grown(st.n, size, 0), grown(st.streak, size, 0)
        bad = self._nonfinite(table)[cols]
        if bad.any():
            st.streak[slots] = 0
            return self._report_nonfinite(rec, table, cols[bad])
        logs = np.log(np.maximum(np.stack([table.stats[s][cols] for s in STATS], 1), 1e-30))
        ratio, z = self._judge(st, slots, logs)
        s = self.settings
        growing = ((ratio >= s.activation_blowup_ratio) & (z >= s.activation_blowup_z)).any(1)
        st.streak[slots] = np.where(growing, st.streak[slots] + 1, 0)
        self._fold(st, slots, logs)
        hits = np.flatnonzero(st.streak[slots] >= s.activation_blowup_readings)
        found = []
        for k in hits[np.argsort(-ratio.max(1)[hits])][: s.max_layer_findings]:
            name = table.names[cols[k]]
            if self.due(rec, name):
                found.append(self._growth(rec, table, cols[k], ratio[k], st.streak[slots[k]]))
        return found

    @staticmethod
    def _nonfinite(table: ActivationTable) -> np.ndarray:
        count = table.stats["nonfinite"]
        bad = np.isfinite(count) & (count > 0)
        for stat in STATS:
            v = table.stats[stat]
            bad |= np.isinf(v) | (np.isnan(v) & np.isfinite(count))  # NaN with a count: data
        return bad

    def _judge(self, st: BlowupState, slots: np.ndarray,
               logs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """ratio to the median and robust z per (module, stat); 0 where too little history."""
        w = self.settings.activation_window
        ratio = np.zeros_like(logs)
        z = np.zeros_like(logs)
        ready = st.n[slots] >= self.settings.min_activation_readings
        if not ready.any():
            return ratio, z
        hist = st.hist[slots[ready]].reshape(-1, len(STATS), w)
        med = np.nanmedian(hist, axis=2)
        mad = MAD_TO_SIGMA * np.nanmedian(np.abs(hist - med[..., None]), axis=2)
        dev = logs[ready] - med
        ratio[ready] = np.exp(dev)
        z[ready] = dev / np.maximum(mad, LOG_FLOOR)
        return ratio, z

    def _fold(self, st: BlowupState, slots: np.ndarray, logs: np.ndarray) -> None:
        w = self.settings.activation_window
        pos = st.n[slots] % w
        for j in range(len(STATS)):
            st.hist[slots, j * w + pos] = logs[:, j]
        st.n[slots] += 1

    def _report_nonfinite(self, rec: StepRecord, table: ActivationTable,
                          bad: np.ndarray) -> list[Finding]:
        first = table.names[bad[0]]
        if not self.due(rec, "nonfinite"):
            return []
        count = float(np.nansum(table.stats["nonfinite"][bad]))
        msg = (f"{first}: non-finite activations ({count:.0f} NaN/Inf entries; "
               f"{len(bad)} module(s) affected)")
        return [self.finding(rec, msg, value=count, threshold=0.0, layer=first,
                             evidence={"modules": len(bad), "nonfinite": count,
                                       "loss": rec.loss, "lr": rec.lr},
                             suggestions=ACTIVATION_BLOWUP)]

    def _growth(self, rec: StepRecord, table: ActivationTable, col: int,
                ratio: np.ndarray, readings: int) -> Finding:
        name = table.names[col]
        j = int(np.argmax(ratio))
        stat, value = STATS[j], float(table.stats[STATS[j]][col])
        label = "max-abs" if stat == "max_abs" else "std"
        msg = (f"{name}: activation {label} {fmt(value)} is {ratio[j]:.0f}x its recent median "
               f"{fmt(value / ratio[j])} for {readings} readings")
        return self.finding(
            rec, msg, value=value, threshold=value / ratio[j] * self.settings.activation_blowup_ratio,
            layer=name, evidence={"stat": stat, "ratio": float(ratio[j]), "readings": int(readings),
                                  "max_abs": float(table.stats["max_abs"][col]),
                                  "std": float(table.stats["std"][col]), "lr": rec.lr},
            suggestions=ACTIVATION_BLOWUP)
