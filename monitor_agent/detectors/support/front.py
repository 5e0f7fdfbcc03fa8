"""The step front of a run: the newest and the slowest latest step of its live ranks.

The cross-rank detectors judge a step once every rank still sending has reported it (or
once the newest rank is ``STALE_STEPS`` past it: a rank that never sends that step, dead
without an end record, must not hold the judgement back forever). That needs, per record,
the smallest and the largest latest step over the live ranks (those that sent a step and
no end record since). A max/min over every rank per record is O(ranks): at a run leader
hearing 1024 ranks, a million rank visits a second. Here each rank's latest step is kept
in a dict and in two heaps with lazy deletion (an entry whose step is no longer its rank's
is dropped when it reaches the top; both heaps are rebuilt once they hold twice as many
entries as there are ranks), so a record costs O(log ranks) amortised.

Three ranks; rank 1 lags, then rank 2's process ends::

    >>> front = StepFront()
    >>> for rank, step in ((0, 5), (1, 3), (2, 6)):
    ...     front.saw(rank, step)
    >>> front.slowest, front.newest
    (3, 6)
    >>> front.saw(1, 5); front.left(2)
    >>> front.slowest, front.newest, front.complete(5), front.complete(6)
    (5, 5, True, False)
"""

from __future__ import annotations

import heapq

STALE_STEPS = 64
"""A step some live rank never sends is judged this far behind the newest."""


class StepFront:
    """Each live rank's latest step, with the slowest and the newest (module docstring)."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}
        self._low: list[tuple[int, int]] = []   # (step, rank), min-heap
        self._high: list[tuple[int, int]] = []  # (-step, rank), min-heap: the newest on top

    def __len__(self) -> int:
        return len(self.steps)

    def saw(self, rank: int, step: int) -> None:
        """A step of ``rank``: its latest from now on (as ``RankFacts.last_step``: the
        engine judges no late step, and a restart from an earlier step is the rank's
        position now)."""
        if self.steps.get(rank) == step:
            return
        self.steps[rank] = step
        heapq.heappush(self._low, (step, rank))
        heapq.heappush(self._high, (-step, rank))
        # A rank moving on leaves its old entry behind in both heaps (in the newest heap
        # at the bottom, where no read pops it): rebuilt once stale entries outnumber
        # live ones, O(ranks) every O(ranks) records.
        if max(len(self._low), len(self._high)) > 2 * len(self.steps) + 32:
            self._rebuild()

    def left(self, rank: int) -> None:
        """``rank`` ended (its end record): no step of it is waited for any more."""
        self.steps.pop(rank, None)

    @property
    def slowest(self) -> int:
        """The smallest latest step of the live ranks (-1: none)."""
        low = self._low
        while low and self.steps.get(low[0][1]) != low[0][0]:
            heapq.heappop(low)
        return low[0][0] if low else -1

    @property
    def newest(self) -> int:
        """The largest latest step of the live ranks (-1: none)."""
        high = self._high
        while high and self.steps.get(high[0][1]) != -high[0][0]:
            heapq.heappop(high)
        return -high[0][0] if high else -1

    def complete(self, step: int) -> bool:
        """Whether every live rank reported ``step`` (or later), or the newest is
        ``STALE_STEPS`` past it."""
        return step <= self.slowest or step <= self.newest - STALE_STEPS

    def judged_through(self) -> int:
        """The latest step that is ``complete``."""
        return max(self.slowest, self.newest - STALE_STEPS)

    def _rebuild(self) -> None:
        self._low = [(s, r) for r, s in self.steps.items()]
        self._high = [(-s, r) for r, s in self.steps.items()]
        heapq.heapify(self._low)
        heapq.heapify(self._high)
