"""Advice more than one detector gives; each detector keeps the rest of its suggestions
next to its logic (most likely fix first). The detectors take these tuples and strings into
their own: ``overfitting`` leads with ``STOP_EARLY`` (``plateau`` appends it to a val-loss
finding), and ``update_ratio_low``'s suggestions are ``NOT_LEARNING``::

    >>> from monitor_agent.detectors import overfitting, update_ratio
    >>> overfitting.OVERFITTING[0] == STOP_EARLY, update_ratio.UPDATE_RATIO_LOW == NOT_LEARNING
    (True, True)
    >>> print(STOP_EARLY)
    Stop early: keep the checkpoint at the best validation loss.
"""

from __future__ import annotations

NOT_LEARNING = (
    "update/param below 1e-7: the run is not learning; raise the learning rate (10-100x).",
    "Check the scheduler is not stuck at 0 and the optimizer holds the parameters.",
)
"""update_ratio_low, and dead_layer when no parameter changed at all."""

STOP_EARLY = "Stop early: keep the checkpoint at the best validation loss."
"""overfitting's first suggestion, and plateau's when val loss stops improving."""
