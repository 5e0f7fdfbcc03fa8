"""What the training thread was last seen doing: data, forward, backward or optimizer; and
``eval`` while the watched model is in eval mode (``model.eval()``), which the watchdog
reports so that a long evaluation is never taken for a hung job (the sidecar never
restarts a job for one: monitor_agent/alerting/restart.py).

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
import weakref
from typing import Any

from monitor_client._hooks import Hooks


class PhaseTracker:
    """The current phase and since when (``time.monotonic``)."""

    __slots__ = ("phase", "since", "_hooks", "_model")

    def __init__(self) -> None:
        self.phase = "unknown"
        self.since = time.monotonic()
        self._hooks = Hooks()
        self._model: Any = None  # a weak reference to the watched model

    def current(self) -> str:
        """The phase as a hang report says it: ``eval`` while the model is in eval mode."""
        model = self._model() if self._model is not None else None
        if model is not None and getattr(model, "training", True) is False:
            return "eval"
        return self.phase

    def enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()

    def seconds(self, now: float) -> float:
        return max(now - self.since, 0.0)

    def attach(self, model: Any, optimizer: Any) -> None:
        """Hook ``model``'s forward (root module only) and ``optimizer``'s step."""
        self.detach()
        try:
            self._model = weakref.ref(model)
        except TypeError:
            self._model = None
        self._hooks.add(model.register_forward_pre_hook(lambda *_: self.enter("forward")),
                        model.register_forward_hook(lambda *_: self.enter("backward")))
        self._hooks.around_step(optimizer, lambda: self.enter("optimizer"),
                                lambda: self.enter("data"))

    def detach(self) -> None:
        self._hooks.remove()
