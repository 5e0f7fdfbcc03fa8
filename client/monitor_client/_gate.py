"""Which steps carry their per-parameter gradient norms: the ones where they matter.

Every step computes one L2 norm per parameter (the global norm is the norm of that vector,
so they cost nothing extra) and copies them to the host with the step's one copy. Sending
them is what costs: about ``len(name) + 12`` bytes of JSON per parameter. ``NormGate`` keeps
them on a step when

* the global grad norm is non-finite (NaN/inf: which parameter went first is the question
  the page must answer), or
* it is above ``ratio`` x the median of the last ``window`` finite global norms
  (``ratio`` 2 by default: the sidecar calls an explosion at 3x and 6 robust sigma, so the
  steps leading into one are sent too, and each layer's departure is seen step by step).

Monitored steps (every ``layer_stats_every``) carry the norms in ``layers`` anyway. A run
whose norm settles at a new level stops being "beyond its band" once the median has moved
there (half a window), so a level shift costs at most ``window / 2`` sent steps.

Runs in the sender thread, after the host copy; plain Python on a few floats.

A first norm has nothing to compare with; a steady run sends nothing; a NaN, and a norm
above twice the median, are sent (1.5 is within the band)::

    >>> gate = NormGate()
    >>> gate.keep(50.0)
    False
    >>> sum(gate.keep(1.0) for _ in range(10))
    0
    >>> gate.keep(float("nan")), gate.keep(3.2), gate.keep(1.5)
    (True, True, False)
"""

from __future__ import annotations

import bisect
import collections
import math

DEFAULT_RATIO = 2.0
DEFAULT_WINDOW = 100
MIN_HISTORY = 10


class NormGate:
    """Decides per step whether the per-parameter norms go out (see module docstring)."""

    def __init__(self, ratio: float = DEFAULT_RATIO, window: int = DEFAULT_WINDOW) -> None:
        self.ratio = ratio
        self._recent: collections.deque[float] = collections.deque(maxlen=window)
        self._sorted: list[float] = []

    def keep(self, grad_norm: float | None) -> bool:
        """Whether this step's per-parameter norms are sent; records the norm."""
        if grad_norm is None:
            return False
        if not math.isfinite(grad_norm):
            return True
        out = (len(self._sorted) >= MIN_HISTORY
               and grad_norm > self.ratio * self._median())
        self._add(grad_norm)
        return out

    def _median(self) -> float:
        v, n = self._sorted, len(self._sorted)
        return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])

    def _add(self, x: float) -> None:
        if len(self._recent) == self._recent.maxlen:
            old = self._recent[0]
            del self._sorted[bisect.bisect_left(self._sorted, old)]
        self._recent.append(x)
        bisect.insort(self._sorted, x)
