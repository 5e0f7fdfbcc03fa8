"""Per-parameter running state as numpy arrays indexed by the run's stable layer slots.

A detector passes each step's values with the columns' slots (``DetectorContext.align``);
here slots 0..2 of a run with four, slot 1 unmeasured (NaN) on the first step and slot 3 on
both::

    >>> ema = LayerEma()
    >>> slots = np.array([0, 1, 2])
    >>> ema.add(slots, np.array([1.0, np.nan, 4.0]), alpha=0.9, size=4)
    >>> ema.add(slots, np.array([2.0, 3.0, 4.0]), alpha=0.9, size=4)
    >>> ema.value(np.arange(4), alpha=0.9, size=4).round(3).tolist()
    [1.526, 3.0, 4.0, nan]
    >>> ema.count(np.arange(4), size=4).tolist()
    [2, 1, 2, 0]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from monitor_agent.detectors.support.slots import grown


@dataclass(slots=True)
class LayerEma:
    """A bias-corrected EMA per layer slot; NaN inputs leave a slot unchanged."""

    raw: np.ndarray = field(default_factory=lambda: np.zeros(0))
    n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    def add(self, slots: np.ndarray, x: np.ndarray, alpha: float, size: int) -> None:
        self.raw = grown(self.raw, size, 0.0)
        self.n = grown(self.n, size, 0)
        ok = np.isfinite(x)
        s = slots[ok]
        self.raw[s] = alpha * self.raw[s] + (1.0 - alpha) * x[ok]
        self.n[s] += 1

    def value(self, slots: np.ndarray, alpha: float, size: int) -> np.ndarray:
        self.raw = grown(self.raw, size, 0.0)
        self.n = grown(self.n, size, 0)
        n = self.n[slots]
        with np.errstate(divide="ignore", invalid="ignore"):
            v = self.raw[slots] / (1.0 - alpha ** n.astype(np.float64))
        return np.where(n > 0, v, np.nan)

    def count(self, slots: np.ndarray, size: int) -> np.ndarray:
        self.n = grown(self.n, size, 0)
        return self.n[slots]
