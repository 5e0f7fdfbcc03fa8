"""Robust running statistics the detectors share: bias-corrected EMA and a rolling window.

Both are plain dataclasses whose fields are JSON-able (see ``state.py``), so a detector's
snapshot is just its fields.

The EMA starts at its first value (no pull toward zero); a window keeps its last ``size``
values, oldest first, and one outlier barely moves its median and MAD::

    >>> ema = Ema(alpha=0.99)
    >>> ema.add(4.2)
    >>> ema.value
    4.2
    >>> win = Window.of(5)
    >>> for x in (1.0, 1.1, 0.9, 1.0, 50.0, 1.2):
    ...     win.add(x)
    >>> win.values().tolist(), win.median(), round(win.mad(), 3)
    ([1.1, 0.9, 1.0, 50.0, 1.2], 1.1, 0.148)
    >>> round(robust_z(1.6, win), 1)
    3.4
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np

MAD_TO_SIGMA = 1.4826  # MAD of a normal distribution times this is its standard deviation


@dataclass(slots=True)
class Ema:
    """Exponential moving average with Adam-style bias correction.

    Starting from zero and dividing by ``1 - alpha**n`` makes the first value the start
    and removes the pull toward zero in the early steps.
    """

    alpha: float = 0.99
    raw: float = 0.0
    n: int = 0

    def add(self, x: float) -> None:
        self.raw = self.alpha * self.raw + (1.0 - self.alpha) * x
        self.n += 1

    @property
    def value(self) -> float | None:
        if self.n == 0:
            return None
        return self.raw / (1.0 - self.alpha**self.n)


@dataclass(slots=True)
class Window:
    """The last ``size`` values (a numpy ring buffer) with median, MAD and order."""

    buf: np.ndarray = field(default_factory=lambda: np.zeros(0))
    n: int = 0
    i: int = 0

    @classmethod
    def of(cls, size: int) -> Window:
        return cls(buf=np.full(size, np.nan))

    def add(self, x: float) -> None:
        self.buf[self.i] = x
        self.i = (self.i + 1) % len(self.buf)
        self.n = min(self.n + 1, len(self.buf))

    def __len__(self) -> int:
        return self.n

    @property
    def full(self) -> bool:
        return self.n == len(self.buf)

    def values(self) -> np.ndarray:
        """The values in insertion order, oldest first."""
        if self.n < len(self.buf):
            return self.buf[: self.n]
        return np.concatenate((self.buf[self.i :], self.buf[: self.i]))

    def last(self) -> float | None:
        return float(self.buf[self.i - 1]) if self.n else None

    def median(self) -> float:
        return sorted_median(np.sort(self.buf[: self.n])) if self.n else math.nan

    def mad(self) -> float:
        """Median absolute deviation, scaled to a standard deviation."""
        if not self.n:
            return math.nan
        v = self.buf[: self.n]
        dev = np.sort(np.abs(v - sorted_median(np.sort(v))))
        return MAD_TO_SIGMA * sorted_median(dev)

    def clear(self) -> None:
        self.n = self.i = 0


def sorted_median(v: np.ndarray) -> float:
    """Median of an already sorted array; np.median costs 10x more on short windows."""
    n = len(v)
    mid = n // 2
    return float(v[mid]) if n % 2 else float(0.5 * (v[mid - 1] + v[mid]))


def median(a: np.ndarray) -> float:
    """np.median without its overhead (short arrays, no NaN handling needed)."""
    return sorted_median(np.sort(a)) if len(a) else math.nan


def robust_z(x: float, window: Window, floor: float = 1e-12) -> float:
    """How many robust standard deviations ``x`` lies above the window's median."""
    return (x - window.median()) / max(window.mad(), floor)


def finite(x: float | None) -> TypeGuard[float]:
    """A number, and not NaN or inf (narrows ``float | None`` to ``float`` for mypy)."""
    return x is not None and math.isfinite(x)


def amp_overflow(rec: Any) -> bool:
    """A loss-scaler overflow step (a StepRecord): the optimizer skipped it; inf grads are
    expected there, so most detectors pass over it."""
    if rec.skipped:
        return True
    return rec.loss_scale is not None and finite(rec.loss) and not finite(rec.grad_norm)


def slope(y: np.ndarray) -> float:
    """Least-squares slope of ``y`` against 0..n-1 (per index)."""
    n = len(y)
    if n < 2:
        return 0.0
    x = np.arange(n, dtype=np.float64) - (n - 1) / 2.0
    return float(np.dot(x, y - y.mean()) / np.dot(x, x))
