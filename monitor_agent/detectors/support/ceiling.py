"""The highest loss a run has reported, and a loss that leaves it by more than a float can
hold: ``divergence``'s ``early`` rule, which needs no history.

The other divergence rules judge a rise in the loss's own noise, which takes
``min_history_steps`` steps to learn; a run whose loss explodes in its first steps (an
LBFGS run of 15 steps whose loss rose 30 decades, 6.9e-05 -> 4.7e+25) is over before they
can say anything. But such a jump is its own evidence. A run's highest loss is usually its
first one, the untrained model's; a loss ``PRECISION`` times above the highest it has
reported - 2**24, the span of float32's significand, the precision losses are computed
in - has left every value the run knew so far below its own rounding error: the model's
outputs have grown by as much as a float can tell apart. No batch and no noise does that
to a non-negative error (a bad batch moves a loss by a factor, not by seven decades), and
the number is the format's, not a tuned one. Only a loss measured from zero is judged so
(a positive error, not one declared signed): a ratio of a loss of either sign is nothing.

A loss that fell four decades, then went up by 51::

    >>> ceiling = Ceiling()
    >>> [ceiling.observe(s, loss) for s, loss in enumerate([0.57, 3e-3, 5e-5, 3.7e-5], 1)]
    [None, None, None, None]
    >>> jump = ceiling.observe(5, 5.2e46)
    >>> jump.onset, jump.highest, jump.highest_step, round(jump.decades)
    (5, 0.57, 1, 47)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PRECISION = 2.0**24
"""float32's significand: a loss this many times its run's highest has left it below its
rounding error."""


@dataclass(frozen=True, slots=True)
class Jump:
    """A loss more than ``PRECISION`` times above the highest reported before it."""

    onset: int  # the first step of the climb that reached it
    highest: float
    highest_step: int
    decades: float  # log10(loss / highest)


@dataclass(slots=True)
class Ceiling:
    """The highest positive finite loss so far and the current climb (snapshot-able)."""

    highest: float | None = None
    highest_step: int = -1
    prev: float | None = None
    climb_from: int = -1  # the first step of the current run of rising losses

    def observe(self, step: int, loss: float) -> Jump | None:
        """Fold in one finite loss; the jump when it is beyond ``PRECISION`` x the highest."""
        if not (loss > 0 and math.isfinite(loss)):
            self.prev, self.climb_from = None, -1
            return None
        rising = self.prev is not None and loss > self.prev
        self.climb_from = (self.climb_from if self.climb_from >= 0 else step) if rising else -1
        self.prev = loss
        highest, at = self.highest, self.highest_step
        if highest is None or loss > highest:
            self.highest, self.highest_step = loss, step
        if highest is None or loss <= PRECISION * highest:
            return None
        onset = self.climb_from if self.climb_from >= 0 else step
        return Jump(onset, highest, at, math.log10(loss / highest))
