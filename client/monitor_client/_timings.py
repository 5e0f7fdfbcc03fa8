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

``compute_time`` on CUDA is measured on the device's clock too: the step's span is the
gap between the optimizer-step events of this step and the one before (one whole step
of the training stream: the previous optimizer update, data, forward, backward, the
wait), and ``compute_time = span - data_time - sync_wait_time``. The host's ``step_time``
gives the same while the host keeps pace with the device (a loss read every step, a launch
queue that is full), but without a sync in the loop the host can run ahead of a busy GPU,
and its interval then measures kernel launches rather than the device's step; the
device's own span also jitters less from step to step. On a step bound by the host's
launches the two agree (the GPU idles between kernels, and the span shows that idle time
as compute, which it is: the rank's own work sets the pace). The data wait is the host's
(``mon.timed``): the device idles for it only when the host is not ahead, so with a host
far ahead and a slow loader compute reads low by up to that wait.

``take()`` hands the step's events (a ``DeviceWait``) to the step record, and the sender
thread reads them one or more steps later with ``query()``, which never waits: events
whose work is not done yet give no split for that step (``read()`` is ``(None, None)``)
rather than a wait (the sender reads a step after its statistics' own event completed,
so in practice they are done by then). Each step makes its own two events (creating one
costs a microsecond or two; it is destroyed when its record is sent), so nothing is
shared between the training thread and the sender but the finished objects.

Only one event per step marks the last gradient: the hooks of every parameter note which
fired last (an attribute store), and only the hook of the parameter that was last on the
previous step records the event. Autograd's order is the same from step to step for the
same graph, so from the second step on that is the true last gradient; a step on which
another parameter turns out to be last (a parameter with no gradient, a different graph)
gives no split, and the next one learns the new order. That keeps it at two event
records per step instead of one per parameter.

**The device's wait for data** (``data_idle_time``). The data wait ``mon.timed`` measures
is the host's: on CUDA the device idles for it only where the work queued before it is done
(a loop that reads its loss every step has nothing queued; one that runs ahead of a busy GPU
may have a whole step). So ``mon.timed`` records two more events on the training stream
around each wait for a batch (``data_began`` / ``data_ended``): the stream reaches the first
once the work queued before the wait is done, and the second, with nothing queued between
them, once the host has its batch; the gap between them on the device's clock is the time
the stream sat idle for data, 0 when the queued work outlasted the wait. Summed over the
step's waits, capped by ``data_time``, it is the step's ``data_idle_time``: what the goodput
ledger charges as ``input`` and ``input_bound`` judges. ``compute_time`` is then the span
less that idle time (not the host's wait) and the all-reduce wait: the device's own work,
also where the host runs ahead. On CPU nothing of this is recorded: the thread's wait is
the device's.

The forward-end boundary the client also knows (the forward hook) is not recorded: the
split needs exactly the gap between the last local gradient and the optimizer step, the
step's span, and the idle time around the data waits.

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
gradient comes last; on the second, 0.03 s pass from its last gradient to its optimizer
step, in a step of 10 s on the device::

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
    ...     events = timings.take()
    >>> [round(x, 6) for x in events.read()[:2]]      # on the sender thread: (wait, span)
    [0.03, 10.0]

A step whose batch the device waits 40 ms for: the stream's queued work ends at 20.0 s, the
host has its batch at 20.04 s (``mon.timed`` records around the wait)::

    >>> Event.now = 20.0; timings.data_began(); Event.now = 20.04; timings.data_ended()
    >>> Event.now = 30.0; model(torch.ones(2, 3)).sum().backward(); opt.step()
    >>> round(timings.take().read()[2], 6)          # the device's idle time for data
    0.04
    >>> timings.detach()
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from monitor_client._hooks import Hooks

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
    """One step's CUDA events: its last local gradient (None when this step has none that
    counts), its optimizer step's start, the previous step's (None on the first), and the
    pairs around each of its waits for data.

    ``read()`` (the sender thread) gives ``(wait, span, idle)`` in seconds on the device's
    clock: last gradient to optimizer step, optimizer step to optimizer step, and the idle
    time across the data waits; each None when an event is missing or its work not done yet
    (``query()``: never a wait), ``idle`` also when the step did not wait through
    ``mon.timed``.
    """

    __slots__ = ("grad", "start", "previous", "data")

    def __init__(self, grad: Any, start: Any, previous: Any,
                 data: list[tuple[Any, Any]] | None = None) -> None:
        self.grad, self.start, self.previous = grad, start, previous
        self.data = data or []

    def read(self) -> tuple[float | None, float | None, float | None]:
        idle: float | None = None
        for began, ended in self.data:
            gap = _gap(began, ended)
            if gap is None:
                idle = None
                break
            idle = (idle or 0.0) + gap
        return _gap(self.grad, self.start), _gap(self.previous, self.start), idle


def _gap(first: Any, second: Any) -> float | None:
    try:
        if first is None or not (first.query() and second.query()):  # never waits
            return None
        return max(float(first.elapsed_time(second)), 0.0) / 1000.0  # ms -> s
    except Exception:  # noqa: BLE001 - a driver error costs this step's split only
        return None


class StepTimings:
    """The last gradient and the optimizer step of each step; see the module docstring.

    ``take()`` once per ``log_step`` returns the all-reduce wait: seconds (CPU), a
    ``DeviceWait`` to read later (CUDA: ``events`` makes the events, by default
    ``device_events(params)``), or ``None`` when this step has no valid gap on CPU (a
    timestamp missing or out of order) or no optimizer step on CUDA.
    """

    def __init__(self, params: list[Any], optimizer: Any,
                 events: EventMaker | None = None) -> None:
        self.params = params
        self.optimizer = optimizer
        self.events = events if events is not None else device_events(params)
        self._last_grad: float | None = None   # host clock
        self._step_start: float | None = None
        self._grad_event: Any = None           # this step's events (CUDA)
        self._start_event: Any = None
        self._previous_start: Any = None       # the last step's optimizer event
        self._seen: int | None = None          # the parameter whose gradient came last
        self._expect: int | None = None        # ... on the step before (events only)
        self._late_grad = False                # a gradient after the pre-hook (a closure)
        self._data_began: Any = None           # the open data wait's first event (CUDA)
        self._data: list[tuple[Any, Any]] = []  # this step's data waits' event pairs
        self._hooks = Hooks()

    @property
    def on_device(self) -> bool:
        """Whether the split comes from CUDA events (else host timestamps)."""
        return self.events is not None

    def attach(self) -> StepTimings:
        """Register the hooks (call before other optimizer pre-hooks: theirs are compute)."""
        self._hooks.around_step(self.optimizer, before=self._optimizer_step)
        self._hooks.add(*(p.register_post_accumulate_grad_hook(self._hooks.guard(
            functools.partial(self._gradient_done, i))) for i, p in enumerate(self.params)))
        return self

    def detach(self) -> None:
        self._hooks.remove()

    def _gradient_done(self, index: int, _param: Any) -> None:
        if self._step_start is not None:
            self._late_grad = True
        self._seen = index
        if self.events is None:
            self._last_grad = time.perf_counter()
        elif index == self._expect:
            if self._grad_event is None:
                self._grad_event = self.events()
            self._grad_event.record()  # again per micro-batch: the last one counts

    def _optimizer_step(self, *_: Any) -> None:
        if self._step_start is not None:  # a closure-driven step may call it again
            return
        self._step_start = time.perf_counter()
        if self.events is not None:
            self._start_event = self.events()
            self._start_event.record()

    def data_began(self) -> None:
        """The training thread asks the loader for a batch (``mon.timed``; CUDA only)."""
        self._data_began = self._recorded()

    def data_ended(self) -> None:
        """... and has it: the pair's gap is the device's idle time for it."""
        began, self._data_began = self._data_began, None
        ended = self._recorded() if began is not None else None
        if ended is not None:
            self._data.append((began, ended))

    def _recorded(self) -> Any:
        """An event recorded on the current stream now; None if the driver refused (a
        step's idle time is lost, never training)."""
        try:
            assert self.events is not None
            event = self.events()
            event.record()
            return event
        except Exception:  # noqa: BLE001 - monitoring never raises into the loop
            return None

    def take(self) -> float | DeviceWait | None:
        """This step's all-reduce wait (see the class docstring), and start the next step
        afresh.

        A step whose optimizer pre-hook ran before its last gradient (an optimizer
        ``step(closure)`` runs backward inside the step) has no such gap.
        """
        grad, start, late, seen = self._last_grad, self._step_start, self._late_grad, self._seen
        grad_event, start_event = self._grad_event, self._start_event
        data, self._data = self._data, []
        self._last_grad = self._step_start = self._seen = None
        self._grad_event = self._start_event = None
        self._late_grad = False
        if self.events is None:
            if grad is None or start is None or start < grad or late:
                return None
            return start - grad
        if start_event is None:  # no optimizer step (a GradScaler skipped it): no span
            return None
        # The wait counts when the parameter that came last this step recorded the event.
        counts = grad_event is not None and not late and seen == self._expect
        if seen is not None:
            self._expect = seen
        previous, self._previous_start = self._previous_start, start_event
        return DeviceWait(grad_event if counts else None, start_event, previous, data)


def split(record: dict[str, Any], wait: float | None, span: float | None = None,
          idle: float | None = None) -> None:
    """Fill ``sync_wait_time`` and ``compute_time`` of a step record from its all-reduce
    wait (seconds) and the step's length: ``span`` (on CUDA, the device's) or else its
    ``step_time``; unless the script passed either field itself (``log_step(...,
    sync_wait_time=...)``: theirs win) or the wait is unknown. ``idle`` (CUDA): the
    device's idle time across the data waits, the step's ``data_idle_time`` (at most its
    ``data_time``), which the compute then leaves out instead of the host's wait::

        >>> record = {"step_time": 0.5, "data_time": 0.1}
        >>> split(record, 0.15); record["sync_wait_time"], round(record["compute_time"], 9)
        (0.15, 0.25)
        >>> record = {"step_time": 0.5, "data_time": 0.1}    # the device's step was 0.8 s
        >>> split(record, 0.15, span=0.8); round(record["compute_time"], 9)
        0.55
        >>> record = {"step_time": 0.5, "data_time": 0.1}    # it idled 20 ms of the 100
        >>> split(record, 0.15, span=0.5, idle=0.02)
        >>> record["data_idle_time"], round(record["compute_time"], 9)
        (0.02, 0.33)
    """
    data = record.get("data_time")
    if idle is not None and record.get("data_idle_time") is None:
        record["data_idle_time"] = min(idle, data) if data is not None else idle
    if wait is None or record.get("sync_wait_time") is not None \
            or record.get("compute_time") is not None:
        return
    length = span if span is not None else record.get("step_time")
    if length is None:
        return
    wait = min(wait, length)
    waited = record.get("data_idle_time")
    waited = waited if waited is not None else data
    record["sync_wait_time"] = wait
    record["compute_time"] = max(length - (waited or 0.0) - wait, 0.0)
