"""Per-rank numbers of a run kept in order, so that "the median of the other ranks'" is a
lookup, not a pass over every rank.

A cross-rank judgement made on each record ("this rank's median step time against the
median of the other ranks' medians") costs O(ranks) a record when it gathers the others'
numbers each time: at 256 ranks, 256 medians of 20-step windows per record, and the run's
CPU grows with the square of its ranks. ``RankedValues`` keeps one number per rank in a
sorted list (NaN counted apart, as ``np.median`` propagates it): replacing a rank's number
is a bisection and a list insertion (a memmove of ``ranks`` pointers, about a microsecond at
a thousand ranks), and the median of every rank's but one is read off the sorted list at
O(log ranks): the very number ``np.median`` gives over the same values.

    >>> import numpy as np
    >>> ranked = RankedValues()
    >>> for rank, value in enumerate((0.30, 0.31, 0.29, 0.55)):
    ...     ranked.set(rank, value)
    >>> ranked.median_without(3), float(np.median([0.30, 0.31, 0.29]))
    (0.3, 0.3)
    >>> ranked.set(3, 0.30); ranked.median_without(0)
    0.3
    >>> ranked.set(1, float("nan")); ranked.median_without(0)   # a NaN among the others
    nan
    >>> ranked.median_without(1)
    0.3
"""

from __future__ import annotations

import bisect
import math

__all__ = ["RankedValues"]


class RankedValues:
    """One float per rank, in order (module docstring); ``len`` is how many ranks."""

    __slots__ = ("_by_rank", "_nans", "_sorted")

    def __init__(self) -> None:
        self._by_rank: dict[int, float] = {}
        self._sorted: list[float] = []  # the non-NaN values, ascending
        self._nans = 0

    def __len__(self) -> int:
        return len(self._by_rank)

    def __contains__(self, rank: object) -> bool:
        return rank in self._by_rank

    def set(self, rank: int, value: float) -> None:
        """``rank``'s number from now on (O(log ranks) plus a memmove)."""
        self.discard(rank)
        self._by_rank[rank] = value
        if math.isnan(value):
            self._nans += 1
        else:
            bisect.insort(self._sorted, value)

    def discard(self, rank: int) -> None:
        value = self._by_rank.pop(rank, None)
        if value is None:
            return
        if math.isnan(value):
            self._nans -= 1
        else:
            del self._sorted[bisect.bisect_left(self._sorted, value)]

    def median_without(self, rank: int) -> float:
        """``np.median`` of every rank's number but ``rank``'s (NaN when one of them is NaN
        or there are none)."""
        own = self._by_rank.get(rank)
        own_nan = own is not None and math.isnan(own)
        if self._nans - own_nan > 0:
            return math.nan
        values = self._sorted
        skip = len(values) if own is None or own_nan else bisect.bisect_left(values, own)
        n = len(values) - (skip < len(values))
        if n <= 0:
            return math.nan

        def at(i: int) -> float:
            return values[i + (i >= skip)]

        mid = n // 2
        if n % 2:
            return float(at(mid))
        return float((at(mid - 1) + at(mid)) / 2)
