"""How often a CPU step computes its global gradient norm: within a stated share of the step.

The gradient norm reads every gradient element. On a GPU that is one fused kernel whose
host cost is a launch, so it runs every step. On a CPU the training thread does the read
itself, and on a small step (an MLP of a few hundred thousand parameters, an RL update) it
was half of the client's whole cost: 150-400 us of a 10 ms step. ``NormBudget`` holds it to
a share of the run's own step time (``WatchSettings.grad_norm_budget``, default 0.5%: half
of the client's 1% target) by computing it on every ``every``-th step only, with the
smallest ``every`` that keeps its amortised cost inside (``norm_stride``): measured, not
guessed, from the norm's own cost and the step's period on this run.

What the detectors then see: ``grad_norm`` on every ``every``-th step, none between (the
sidecar's detectors take a step without one as a step that says nothing of its gradient:
``grad_explosion``, ``divergence`` and ``not_learning`` judge the steps that have one), and
on every layer-statistics or distributions step. What is never skipped: on each step
without the norm, each gradient's rows' first 32 bytes (the forward finite check's sample,
``_finite.sample``) are read, and the step computes the full norm after all when the
sample's norm is NaN or infinite, or above twice the median of the last samples' norms
(``_gate.NormGate``, as the per-parameter norms are gated): a NaN or infinite gradient, and
a jump, are on their own step's record (``grad_norm``, and the per-parameter norms that
name where it is). A non-finite value confined to the rest of one row of one gradient is
seen on the next full norm, or on the next step's loss (the optimizer writes it into the
weights). The run record's config says the share (``grad_norm_budget``); the training log
says the stride once it is above 1.

The stride as a pure function of the measured costs: a norm within the budget runs every
step, one costing 3x its share every 3rd step, never rarer than ``most``::

    >>> norm_stride(norm_s=40e-6, step_s=10e-3, share=0.005, most=25)
    1
    >>> norm_stride(norm_s=150e-6, step_s=10e-3, share=0.005, most=25)
    3
    >>> norm_stride(norm_s=150e-6, step_s=1e-3, share=0.005, most=25)
    25
    >>> norm_stride(norm_s=150e-6, step_s=1e-3, share=0.0, most=25)    # 0: every step
    1
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque

from monitor_client._warn import LOGGER
from monitor_client.settings import DEFAULT_GRAD_NORM_BUDGET

# Measurements the stride is decided from: the medians of the last few, so one preempted
# step (a loaded machine, a checkpoint between steps) does not move it.
WINDOW = 9

__all__ = ["NormBudget", "norm_stride"]


def norm_stride(norm_s: float, step_s: float, share: float, most: int) -> int:
    """The smallest ``k`` (at most ``most``) for which a norm costing ``norm_s`` computed on
    every ``k``-th step of ``step_s`` costs at most ``share`` of each step."""
    allowed = share * step_s
    if allowed <= 0 or norm_s <= allowed or not math.isfinite(norm_s / allowed):
        return 1
    return max(1, min(int(most), math.ceil(norm_s / allowed)))


class NormBudget:
    """The stride in force on one model's steps, from its measured costs (module docstring).

    ``begin()`` at each optimizer step's start (the period between two is the step's
    time), ``due()`` says whether this step computes the norm, ``spent(seconds)`` after a
    norm was computed. Until ``WINDOW`` norms and periods are measured, every step has one.
    """

    def __init__(self, share: float = DEFAULT_GRAD_NORM_BUDGET, most: int = 25) -> None:
        self.share = share
        self.most = max(1, int(most))
        self.every = 1
        self._since = 0                      # steps since the last norm
        self._norms: deque[float] = deque(maxlen=WINDOW)
        self._periods: deque[float] = deque(maxlen=WINDOW)
        self._last: float | None = None
        self._told = False

    def begin(self, now: float | None = None) -> None:
        now = time.perf_counter() if now is None else now
        if self._last is not None:
            self._periods.append(now - self._last)
        self._last = now

    def due(self) -> bool:
        """Whether this step computes its norm (every ``every``-th one)."""
        return self._since + 1 >= self.every

    def skipped(self) -> None:
        self._since += 1

    def spent(self, seconds: float) -> None:
        """A norm was computed this step, in ``seconds``: the stride is decided again."""
        self._since = 0
        self._norms.append(seconds)
        if self.share > 0 and len(self._norms) == WINDOW and len(self._periods) >= WINDOW:
            norm, step = statistics.median(self._norms), statistics.median(self._periods)
            self.every = norm_stride(norm, step, self.share, self.most)
            if self.every > 1 and not self._told:
                self._told = True
                LOGGER.info("monitor_client: the gradient norm costs %.0f us of a %.0f us step "
                            "(more than grad_norm_budget=%g of it): it is computed every %d "
                            "steps on this run (each step's gradients are still checked for "
                            "NaN/inf; docs/client-cost.md)", norm * 1e6, step * 1e6,
                            self.share, self.every)
