"""Where a data-parallel step's time goes: the wait in the gradient all-reduce, and compute.

In synchronous data parallelism (DDP) every rank's ``step_time`` is the same: the ranks
wait for each other in the gradient all-reduce, so a slow rank shows only in how its step
splits. ``StepTimings`` measures the split with host timestamps and no device sync:

- the last gradient accumulated on this rank (a ``register_post_accumulate_grad_hook`` on
  every watched parameter: each one stores a ``perf_counter`` time, nothing else): local
  backward compute is done there;
- the optimizer's step pre-hook (registered before the statistics' own pre-hook). In
  between, DDP's end-of-backward callback waits for the all-reduce of its gradient
  buckets, so ``sync_wait_time`` is the second minus the first. It also holds whatever
  the script runs between ``backward()`` and ``step()`` (its own ``clip_grad_norm_``, a
  ``GradScaler.unscale_``): small next to a wait for a slower peer.

``compute_time`` is then ``step_time - data_time - sync_wait_time`` (``Monitor.log_step``):
what this rank spent on its own work (forward, backward, optimizer, the script's own code),
with the data wait (``mon.timed(loader)``) and the collective wait taken out. With gradient
accumulation the last micro-batch's gradients end the compute; its all-reduce is the one
the optimizer step waits for.

On CUDA these host timestamps are launch times: the hooks run when the autograd engine
queues a kernel, not when the GPU finishes it, and NCCL's all-reduce makes the compute
stream wait on the device while the host runs ahead. The host gap would then measure
kernel launches, not the wait, and would mislabel the straggler. So on CUDA ``take()``
reports nothing (the record carries no ``sync_wait_time``/``compute_time``, the sidecar
falls back to ``data_time``), rather than a number that reads as a fact and is not one.

A step on CPU whose backward ends and whose optimizer step starts 50 ms later (the peers'
all-reduce, here a sleep)::

    >>> import time, torch
    >>> model = torch.nn.Linear(3, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> timings = StepTimings(list(model.parameters()), opt).attach()
    >>> model(torch.ones(2, 3)).sum().backward()
    >>> time.sleep(0.05)
    >>> opt.step()
    >>> wait = timings.take()
    >>> 0.05 <= wait < 1.0, timings.take()       # taken: the next step starts afresh
    (True, None)
    >>> timings.detach()
"""

from __future__ import annotations

import time
from typing import Any


class StepTimings:
    """Host timestamps of a step's last gradient and its optimizer step; see the module
    docstring. ``take()`` once per ``log_step`` returns the all-reduce wait in seconds
    (``None`` when a timestamp is missing, out of order, or the parameters are on CUDA)."""

    def __init__(self, params: list[Any], optimizer: Any) -> None:
        self.params = params
        self.optimizer = optimizer
        self.launch_times = any(p.device.type == "cuda" for p in params)
        self._last_grad: float | None = None
        self._step_start: float | None = None
        self._handles: list[Any] = []

    def attach(self) -> StepTimings:
        """Register the hooks (call before other optimizer pre-hooks: theirs are compute)."""
        if self.launch_times:
            return self
        self._handles.append(self.optimizer.register_step_pre_hook(self._optimizer_step))
        for p in self.params:
            self._handles.append(p.register_post_accumulate_grad_hook(self._gradient_done))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _gradient_done(self, _param: Any) -> None:
        self._last_grad = time.perf_counter()

    def _optimizer_step(self, *_: Any) -> None:
        if self._step_start is None:  # a closure-driven step may call it again
            self._step_start = time.perf_counter()

    def take(self) -> float | None:
        """This step's all-reduce wait (seconds), and start the next step afresh.

        A step whose optimizer pre-hook ran before its last gradient (an optimizer
        ``step(closure)`` runs backward inside the step) has no such gap: ``None``.
        """
        grad, start = self._last_grad, self._step_start
        self._last_grad = self._step_start = None
        if grad is None or start is None or start < grad:
            return None
        return start - grad
