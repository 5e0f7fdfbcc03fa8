"""What the training thread was last seen doing: data, forward, backward or optimizer.

Set by hooks that already run each step (a forward pre/post hook on the watched model, the
optimizer's step pre/post hooks, ``Monitor.timed``, ``log_step``): two attribute stores per
call, no lock (one writer, the training thread; the watchdog reads a value at most one
phase old). Forward's end is taken as the start of backward: the loss and the backward
pass follow it, and a collective inside backward (DDP's all-reduce) is then "backward".

    >>> import time
    >>> tracker = PhaseTracker()
    >>> tracker.enter("forward")
    >>> tracker.phase, tracker.seconds(time.monotonic()) < 1.0
    ('forward', True)
"""

from __future__ import annotations

import time
from typing import Any

from monitor_client._hooks import Hooks


class PhaseTracker:
    """The current phase and since when (``time.monotonic``)."""

    __slots__ = ("phase", "since", "_hooks")

    def __init__(self) -> None:
        self.phase = "unknown"
        self.since = time.monotonic()
        self._hooks = Hooks()

    def enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()

    def seconds(self, now: float) -> float:
        return max(now - self.since, 0.0)

    def attach(self, watched: list[tuple[Any, Any]]) -> None:
        """Hook each model's forward (root module only) and each optimizer's step (none:
        a loop that updates its parameters by hand), dropping the hooks of before."""
        self.detach()
        for model, optimizer in watched:
            self._hooks.add(model.register_forward_pre_hook(self._forward),
                            model.register_forward_hook(self._backward))
            if optimizer is not None:
                self._hooks.add(optimizer.register_step_pre_hook(self._optimizer),
                                optimizer.register_step_post_hook(self._data))

    # The hooks themselves: bound methods, not lambdas around enter(), since they run on
    # every step (two attribute stores; nothing here can fail).
    def _forward(self, *_: Any) -> None:
        self.phase, self.since = "forward", time.monotonic()

    def _backward(self, *_: Any) -> None:
        self.phase, self.since = "backward", time.monotonic()

    def _optimizer(self, *_: Any) -> None:
        self.phase, self.since = "optimizer", time.monotonic()

    def _data(self, *_: Any) -> None:
        self.phase, self.since = "data", time.monotonic()

    def detach(self) -> None:
        self._hooks.remove()
