"""Where a data-parallel step's time goes: the wait in the gradient all-reduce, and compute.

In synchronous data parallelism (DDP) every rank's ``step_time`` is the same: the ranks
wait for each other in the gradient all-reduce, so a slow rank shows only in how its step
splits. ``StepTimings`` measures the split between two points of each step, with no
device sync on the training thread:

- the last gradient accumulated on this rank (a ``register_post_accumulate_grad_hook`` on
  every watched parameter): local backward compute is done there;
- the optimizer's step pre-hook (registered before the statistics' own pre-hook). In
  between, DDP's end-of-backward callback waits for the all-reduce of its gradient
  buckets, so ``sync_wait_time`` is the second minus the first. It also holds whatever
  the script runs between ``backward()`` and ``step()`` (its own ``clip_grad_norm_``, a
  ``GradScaler.unscale_``): small next to a wait for a slower peer.

``compute_time`` is then ``step_time - data_time - sync_wait_time`` (``split``): what this
rank spent on its own work (forward, backward, optimizer, the script's own code), with the
data wait (``mon.timed(loader)``) and the collective wait taken out. With gradient
accumulation the last micro-batch's gradients end the compute; its all-reduce is the one
the optimizer step waits for.

**On CPU** the two points are host timestamps (``perf_counter``): CPU kernels have run by
the time a hook runs, and gloo's wait blocks the host.

**On CUDA** host timestamps would be launch times: a hook runs when the autograd engine
queues a kernel, not when the GPU finishes it, and NCCL's all-reduce makes the compute
stream wait *on the device* while the host runs ahead. So there the two points are CUDA
events recorded on the training stream (the current stream of the thread that runs the
hook: the one the gradient kernels went to). The gap between them on the device's own
clock is the time the stream spent from its last local gradient to the end of the
all-reduce work it was made to wait for: NCCL's wait. Recording an event queues a marker
and returns (a few microseconds, no sync); nothing on the training thread reads them.
``take()`` hands the step's pair (a ``DeviceWait``) to the step record, and the sender
thread reads it one or more steps later with ``query()``, which never waits: a pair whose
work is not done yet gives no split for that step (``seconds()`` is None) rather than a
wait (the sender reads a step after its statistics' own event completed, so in practice
every pair is done by then). Pairs are recycled through a free list shared with the
sender thread (a ``deque``, whose ``append``/``popleft`` are atomic under the GIL).

Only one event per step marks the last gradient: the hooks of every parameter note which
fired last (an attribute store), and only the hook of the parameter that was last on the
previous step records the event. Autograd's order is the same from step to step for the
same graph, so from the second step on that is the true last gradient; a step on which
another parameter turns out to be last (a parameter with no gradient, a different graph)
gives no split, and the next one learns the new order. That keeps it at two event
records per step instead of one per parameter.

The data-ready and forward-end boundaries the client also knows (``mon.timed``, the
forward hook) are not recorded: the split needs exactly the gap between the last local
gradient and the optimizer step; the rest of the step is ``step_time - data_time`` on
both devices, so ``compute_time`` means the same thing on CPU and CUDA.

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

The same with events: a stand-in for ``torch.cuda.Event`` whose clock the example sets
(tests/client/test_timings.py has a fuller one). The first step learns which parameter's
gradient comes last, the second is measured, and its pair is read afterwards::

    >>> class Event:
    ...     now = 0.0                                 # the device's clock, in seconds
    ...     def record(self): self.t = Event.now
    ...     def query(self): return True              # its work is done
    ...     def elapsed_time(self, end): return (end.t - self.t) * 1000.0   # ms, as CUDA's
    >>> timings = StepTimings(list(model.parameters()), opt, events=Event).attach()
    >>> for step in (1, 2):
    ...     Event.now = 10.0 * step                   # the device reaches the last gradient
    ...     model(torch.ones(2, 3)).sum().backward()
    ...     Event.now += 0.03                         # ... and the optimizer 30 ms later
    ...     opt.step()
    ...     pair = timings.take()
    >>> round(pair.seconds(), 6), pair.seconds()      # on the sender thread; read once
    (0.03, None)
    >>> timings.detach()
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable
from typing import Any

EventMaker = Callable[[], Any]


def cuda_event() -> Any:
    """A CUDA event that keeps a timestamp (``elapsed_time`` needs ``enable_timing``)."""
    import torch

    return torch.cuda.Event(enable_timing=True)


def device_events(params: list[Any]) -> EventMaker | None:
    """Where the split's two points come from: CUDA events for parameters on a CUDA device,
    else None (host timestamps)."""
    return cuda_event if any(p.device.type == "cuda" for p in params) else None


class DeviceWait:
    """One step's two CUDA events: the last local gradient, and the optimizer step's start.

    ``seconds()`` (the sender thread) is the gap between them on the device's clock, or
    None while either has not completed; either way the pair then goes back to the free
    list it came from, for a later step to record again.
    """

    __slots__ = ("grad", "start", "free")

    def __init__(self, make: EventMaker) -> None:
        self.grad, self.start = make(), make()
        # The free list it goes back to once read; None while it is there (read once).
        self.free: collections.deque[DeviceWait] | None = None

    def seconds(self) -> float | None:
        free, self.free = self.free, None
        if free is None:  # already read: the events may be recording a later step now
            return None
        try:
            if not (self.grad.query() and self.start.query()):  # query(): never waits
                return None
            return max(float(self.grad.elapsed_time(self.start)), 0.0) / 1000.0  # ms -> s
        except Exception:  # noqa: BLE001 - a driver error costs this step's split only
            return None
        finally:
            free.append(self)


class StepTimings:
    """The last gradient and the optimizer step of each step; see the module docstring.

    ``take()`` once per ``log_step`` returns the all-reduce wait: seconds (CPU), a
    ``DeviceWait`` to read later (CUDA: ``events`` makes the events, by default
    ``device_events(params)``), or ``None`` when this step has no valid gap (a timestamp
    missing or out of order, the last gradient not the one expected).
    """

    def __init__(self, params: list[Any], optimizer: Any,
                 events: EventMaker | None = None) -> None:
        self.params = params
        self.optimizer = optimizer
        self.events = events if events is not None else device_events(params)
        self._free: collections.deque[DeviceWait] = collections.deque()
        self._pair: DeviceWait | None = None
        self._last_grad: float | None = None   # host clock
        self._step_start: float | None = None
        self._seen: int | None = None          # the parameter whose gradient came last
        self._expect: int | None = None        # ... on the step before (events only)
        self._grad_marked = False              # the expected parameter recorded this step
        self._late_grad = False                # a gradient after the pre-hook (a closure)
        self._handles: list[Any] = []

    @property
    def on_device(self) -> bool:
        """Whether the split comes from CUDA events (else host timestamps)."""
        return self.events is not None

    def attach(self) -> StepTimings:
        """Register the hooks (call before other optimizer pre-hooks: theirs are compute)."""
        self._handles.append(self.optimizer.register_step_pre_hook(self._optimizer_step))
        for i, p in enumerate(self.params):
            self._handles.append(p.register_post_accumulate_grad_hook(
                functools.partial(self._gradient_done, i)))
        return self

    def detach(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def _gradient_done(self, index: int, _param: Any) -> None:
        if self._step_start is not None:
            self._late_grad = True
        self._seen = index
        if self.events is None:
            self._last_grad = time.perf_counter()
        elif index == self._expect:
            self._event_pair().grad.record()
            self._grad_marked = True

    def _optimizer_step(self, *_: Any) -> None:
        if self._step_start is not None:  # a closure-driven step may call it again
            return
        self._step_start = time.perf_counter()
        if self.events is not None and self._grad_marked:
            self._event_pair().start.record()

    def _event_pair(self) -> DeviceWait:
        if self._pair is None:
            assert self.events is not None
            pair = self._free.popleft() if self._free else DeviceWait(self.events)
            pair.free = self._free
            self._pair = pair
        return self._pair

    def take(self) -> float | DeviceWait | None:
        """This step's all-reduce wait (see the class docstring), and start the next step
        afresh.

        A step whose optimizer pre-hook ran before its last gradient (an optimizer
        ``step(closure)`` runs backward inside the step) has no such gap: ``None``.
        """
        grad, start, late = self._last_grad, self._step_start, self._late_grad
        marked, seen = self._grad_marked, self._seen
        self._last_grad = self._step_start = self._seen = None
        self._grad_marked = self._late_grad = False
        if self.events is None:
            if grad is None or start is None or start < grad or late:
                return None
            return start - grad
        # Events: valid when the parameter that was last this step recorded the event.
        valid = marked and start is not None and not late and seen == self._expect
        if seen is not None:
            self._expect = seen
        pair, self._pair = self._pair, None
        if not valid:
            if pair is not None:
                pair.free = None
                self._free.append(pair)
            return None
        return pair


def split(record: dict[str, Any], wait: float | None) -> None:
    """Fill ``sync_wait_time`` and ``compute_time`` of a step record from its all-reduce
    wait (seconds), unless the script passed either itself (``log_step(...,
    sync_wait_time=...)``: theirs win) or the wait is unknown::

        >>> record = {"step_time": 0.5, "data_time": 0.1}
        >>> split(record, 0.15); record["sync_wait_time"], round(record["compute_time"], 9)
        (0.15, 0.25)
    """
    if wait is None or record.get("sync_wait_time") is not None \
            or record.get("compute_time") is not None:
        return
    step_time = record.get("step_time")
    if step_time is None:
        return
    wait = min(wait, step_time)
    record["sync_wait_time"] = wait
    record["compute_time"] = max(step_time - (record.get("data_time") or 0.0) - wait, 0.0)
