"""What the training thread is doing when it hangs: data, forward, backward or optimizer;
and ``eval`` while every watched model is in eval mode (``model.eval()``), which the
watchdog reports so that a long evaluation is never taken for a hung job (the sidecar
never restarts a job for one: monitor_agent/alerting/restart.py).

Two sources. Where the step is when the watchdog reports it: the training thread's stack,
innermost frame first (``on_stack``): inside a module's ``forward`` (torch's module call),
inside ``backward()`` (autograd), inside ``optimizer.step()``, or fetching a batch (a
``DataLoader``). And, for what the stack cannot tell, the last transition the client saw
(``PhaseTracker``): the optimizer's step pre/post hooks, ``Monitor.timed`` and ``log_step``
(two attribute stores per call, no lock: one writer, the training thread; the watchdog reads
a value at most one phase old). A step's forward and backward are read from the stack
rather than hooked: a hook on the model would run on every forward call, hundreds per step
in a loop of small forwards (an RL episode), for a value read only when a run hangs.

    >>> import time
    >>> tracker = PhaseTracker()
    >>> tracker.enter("optimizer")
    >>> tracker.phase, tracker.seconds(time.monotonic()) < 1.0
    ('optimizer', True)
    >>> on_stack([{"file": "train.py", "function": "main"},
    ...           {"file": "torch/_tensor.py", "function": "backward"},
    ...           {"file": "torch/autograd/graph.py", "function": "_engine_run_backward"}])
    'backward'
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any

from monitor_client._hooks import Hooks

# (where the file's path ends, its functions or None for any): the frames that say which
# phase a stack is in. Paths are matched by their end, wherever torch is installed.
_PHASES: tuple[tuple[str, tuple[str, ...] | None, str], ...] = (
    ("torch/nn/modules/module.py", ("_call_impl", "_wrapped_call_impl"), "forward"),
    ("torch/autograd/graph.py", ("_engine_run_backward",), "backward"),
    ("torch/autograd/__init__.py", ("backward", "grad"), "backward"),
    ("torch/_tensor.py", ("backward",), "backward"),
    ("torch/optim/optimizer.py", None, "optimizer"),
    ("torch/utils/data/dataloader.py", None, "data"),
)


def on_stack(frames: list[dict[str, Any]]) -> str | None:
    """The phase the innermost telling frame of ``frames`` (outermost first, as a hang
    record lists them) is in, or None when none tells."""
    for frame in reversed(frames):
        file, function = str(frame.get("file", "")), frame.get("function")
        for suffix, functions, phase in _PHASES:
            if file.endswith(suffix) and (functions is None or function in functions):
                return phase
    return None


class PhaseTracker:
    """The last phase the client saw begin, and since when (``time.monotonic``)."""

    __slots__ = ("phase", "since", "_hooks", "_models")

    def __init__(self) -> None:
        self.phase = "unknown"
        self.since = time.monotonic()
        self._hooks = Hooks()
        self._models: list[Any] = []  # weak references to the watched models

    def evaluating(self) -> str | None:
        """``eval`` while every watched model is in eval mode (one in training mode, a
        policy beside its target network, is a training step), else None."""
        models = [ref() for ref in self._models]
        if models and all(m is not None and getattr(m, "training", True) is False
                          for m in models):
            return "eval"
        return None

    def enter(self, phase: str) -> None:
        self.phase, self.since = phase, time.monotonic()

    def seconds(self, now: float) -> float:
        return max(now - self.since, 0.0)

    def attach(self, optimizers: list[Any], models: Sequence[Any] = ()) -> None:
        """Hook each optimizer's step (None: a loop that updates its parameters by hand),
        dropping the hooks of before; ``models``, the watched ones, are read for eval mode."""
        self.detach()
        self._models = []
        for model in models:
            try:
                self._models.append(weakref.ref(model))
            except TypeError:
                continue  # a model that takes no weak reference is never read as in eval
        for optimizer in optimizers:
            if optimizer is not None:
                self._hooks.add(optimizer.register_step_pre_hook(self._optimizer),
                                optimizer.register_step_post_hook(self._data))

    # The hooks themselves: bound methods, not lambdas around enter(), since they run on
    # every step (two attribute stores; nothing here can fail).
    def _optimizer(self, *_: Any) -> None:
        self.phase, self.since = "optimizer", time.monotonic()

    def _data(self, *_: Any) -> None:
        self.phase, self.since = "data", time.monotonic()

    def detach(self) -> None:
        self._hooks.remove()
