"""The every-step gradient norms of a CPU step, computed beside the optimizer's step.

On a small CPU step the per-parameter gradient norms (one ``torch._foreach_norm``, one read
of every gradient element) are the largest part of what the client costs the training
thread. They are needed on the host only after the step (the record goes out then), and
torch releases the GIL inside its operators, so ``GradStats``' optimizer pre-hook hands
the gradients to this worker and the optimizer steps while it reads them; the post-hook
takes the result (``NormWorker.result``)::

    >>> worker = NormWorker()
    >>> worker.submit([torch.ones(4), torch.full((2,), 3.0)], None)
    True
    >>> worker.result()
    tensor([2.0000, 4.2426])
    >>> worker.close()

The values are the synchronous ones, bit for bit (the same operator on the same tensors);
whether the gradients stayed the same while they were read is the caller's to check
(``GradStats``: their ``_version`` before and after the step). A failed read gives None,
and the caller computes the norms itself. One worker per watched model, started on its
first use; a daemon thread, so a script that never closes its Monitor still exits.
"""

from __future__ import annotations

import threading

import torch

from monitor_client._warn import LOGGER

__all__ = ["NormOffload", "NormWorker", "WayChooser"]

# How often a wait for the result looks whether the worker is still alive: a live worker is
# waited for (its read is the one the training thread would do itself), a dead one is not.
_POLL_S = 0.05


class NormWorker:
    """One background thread that stacks ``torch._foreach_norm`` of the gradients it is
    given, one job at a time (module docstring)."""

    def __init__(self) -> None:
        self._job: tuple[list[torch.Tensor], torch.dtype | None] | None = None
        self._result: torch.Tensor | None = None
        # Two bare locks as semaphores: releasing one wakes the other thread for a few
        # microseconds, a third of what a threading.Event costs (measured).
        self._go = threading.Lock()
        self._go.acquire()
        self._done = threading.Lock()
        self._done.acquire()
        self._closed = False
        self._thread: threading.Thread | None = None

    def submit(self, grads: list[torch.Tensor], dtype: torch.dtype | None) -> bool:
        """Start reading ``grads``' norms (in ``dtype``, as ``_stats._norm_list``); False
        when the worker cannot take it (closed, or its thread did not start)."""
        if self._closed or self._job is not None:
            return False
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="monitor-grad-norms",
                                            daemon=True)
            try:
                self._thread.start()
            except RuntimeError:  # no thread to be had (interpreter shutdown, limits)
                self._closed = True
                return False
        self._job = (grads, dtype)
        self._go.release()
        return True

    def result(self) -> torch.Tensor | None:
        """The submitted job's norms, one per gradient, as one vector; None when the read
        failed or the worker is gone. Waits while the worker is alive and reading."""
        if self._job is None:
            return None
        thread = self._thread
        while not self._done.acquire(timeout=_POLL_S):
            if thread is None or not thread.is_alive():
                self._closed = True
                self._job = None
                return None
        self._job = None
        result, self._result = self._result, None
        return result

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._job is None and self._thread is not None:
                self._go.release()  # wake it to end

    def _run(self) -> None:
        torch.set_grad_enabled(False)  # this thread's own mode: gradients are only read
        while True:
            self._go.acquire()
            job = self._job
            if self._closed or job is None:
                return
            self._result = _read(*job)
            self._done.release()


def _read(grads: list[torch.Tensor], dtype: torch.dtype | None) -> torch.Tensor | None:
    try:
        if dtype is None:
            return torch.stack(torch._foreach_norm(grads, 2))
        return torch.stack(torch._foreach_norm(grads, 2, dtype=dtype))
    except Exception:  # noqa: BLE001 - the caller reads them itself instead
        return None


class WayChooser:
    """Whether reading the norms beside the step pays on this machine now: measured on the
    run's own steps, not assumed.

    Beside the step, the read costs the training thread a hand-over and a wait, and it
    saves the read only if another core is free to do it while the optimizer steps; on a
    machine whose cores are busy (the loader's workers, another job) the woken worker
    takes the training thread's core and the step is longer than reading the norms itself
    (measured on a loaded 2-core machine: the inline read 2.6% faster on a 1 ms step).
    So each way is timed over the same span of eligible steps (the read or the hand-over,
    the optimizer's step, the result taken), ``SAMPLES`` of each in alternation; the read
    on the training thread is kept for the next ``HOLD`` eligible steps when it was the
    faster in three of four pairs of steps, else the read beside the step, then they are
    compared again (the machine's load changes; a comparison costs at most ``SAMPLES``
    steps of the slower way)::

        >>> ways = WayChooser()
        >>> for _ in range(2 * WayChooser.SAMPLES):  # the read here twice as fast as beside
        ...     beside = ways.way()
        ...     ways.took(beside, 2e-3 if beside else 1e-3)
        >>> ways.way()                               # read on the training thread from now
        False
    """

    SAMPLES = 8
    HOLD = 500
    CLEARLY = 0.75  # of the pairs of steps: three to one

    def __init__(self, fixed: bool | None = None) -> None:
        self.beside = True if fixed is None else fixed
        self._times: dict[bool, list[float]] = {True: [], False: []}
        self._fixed = fixed is not None  # a fixed way (tests of each way) is never compared
        self._comparing = not self._fixed
        self._held = 0

    def way(self) -> bool:
        """True: read this eligible step's norms beside it; False: on the training thread."""
        if self._comparing:
            return len(self._times[True]) <= len(self._times[False])
        return self.beside

    def took(self, beside: bool, seconds: float) -> None:
        """One eligible step's span, the way it went."""
        if not self._comparing:
            self._held += 1
            if self._held >= self.HOLD and not self._fixed:
                self._comparing, self._held = True, 0
            return
        self._times[beside].append(seconds)
        if min(len(t) for t in self._times.values()) >= self.SAMPLES:
            here, there = self._times[False], self._times[True]
            # The training thread's own read only when it is faster in most pairs of
            # steps, not just in the medians: on a busy machine a step's span varies by
            # more than the read, and a coin-flip switch costs the step whichever way it
            # lands (the rank statistic of the two samples, as Mann-Whitney's U).
            faster = sum(h < t for h in here for t in there) / (len(here) * len(there))
            self.beside = faster < self.CLEARLY
            self._times = {True: [], False: []}
            self._comparing = False


class NormOffload:
    """Whether one optimizer's steps may have their gradient norms read beside them, and
    the reads in flight (``GradStats``).

    A concurrent read is exact only if the step leaves the gradients alone, and some steps
    do not (an optimizer that negates them in place for ``maximize``, adds the weight decay
    into them, or clips them; a hook that zeroes them). So the first ``TRIAL`` steps are
    read on the training thread and checked across the step: each gradient's ``_version``
    (torch's count of in-place writes) and, for a write through ``.data`` (which has a
    count of its own: old-style optimizers write ``p.grad.data``), their norms read again
    after it, bit for bit. Only an optimizer seen leaving them alone has its later steps
    read beside it; each later step read on the training thread anyway (a layer-statistics
    or distributions step) is checked again the same way. A read beside a step whose versions moved after
    all is not used (the step then has no norm: no reading, which the sidecar's detectors
    treat as a gap) and the optimizer is read on the training thread from then on. What
    this cannot see: an optimizer that writes through ``.data`` only on some steps, none
    of them checked.
    """

    TRIAL = 3

    def __init__(self) -> None:
        self.worker: NormWorker | None = None
        self.calm = 0          # trial steps seen leaving the gradients alone
        self.off = False       # read on the training thread for good
        # Which way each eligible step goes once the trial passed; None: always beside.
        self.ways: WayChooser | None = WayChooser()
        self._grads: list[torch.Tensor] = []
        self._versions: list[int] | None = None
        self._dtype: torch.dtype | None = None
        self._norms: list[torch.Tensor] = []  # a checked step's, read before it
        self._recheck = True   # read the norms again after the step (the trial's check)
        self._timed: tuple[bool, float] | None = None  # an eligible step's way and start
        self.pending = False

    @property
    def ready(self) -> bool:
        return not self.off and self.calm >= self.TRIAL

    def watch(self, grads: list[torch.Tensor], norms: list[torch.Tensor],
              dtype: torch.dtype | None, recheck: bool = True) -> None:
        """A step read on the training thread (its ``norms``): see whether it writes to
        the gradients. ``recheck=False``: an eligible step read here because that way was
        faster (``WayChooser``): checked as a step read beside it is, by the versions only
        (a second read would double the way's cost)."""
        if not self.off:
            self._grads, self._versions = grads, [g._version for g in grads]
            self._norms, self._dtype, self._recheck = norms, dtype, recheck

    def way(self, start: float) -> bool:
        """Whether this eligible step (past the trial, nothing needing its norms before the
        step) is read beside it; its span is timed from ``start`` (``done``)."""
        beside = self.ways.way() if self.ways is not None else True
        self._timed = (beside, start) if self.ways is not None else None
        return beside

    def done(self, end: float) -> None:
        """The eligible step's span ended (its result taken, ``GradStats.after_step``)."""
        if self._timed is not None and self.ways is not None and not self.off:
            beside, start = self._timed
            self.ways.took(beside, end - start)
        self._timed = None

    def submit(self, grads: list[torch.Tensor], dtype: torch.dtype | None) -> bool:
        worker = self.worker = self.worker or NormWorker()
        versions = [g._version for g in grads]
        if not worker.submit(grads, dtype):
            self.off = True
            return False
        self._grads, self._versions, self._dtype = grads, versions, dtype
        self.pending = True
        return True

    def learn(self) -> None:
        """After a checked step: count it calm, or stop offloading if it wrote to a
        gradient."""
        if self._versions is None:
            return
        if self._moved() or (self._recheck
                             and not _same(self._norms, _read(self._grads, self._dtype))):
            self.off = True
        else:
            self.calm += 1
        self._grads, self._versions, self._norms, self._recheck = [], None, [], True

    def take(self) -> torch.Tensor | None:
        """The norms of the step in flight, or None when its gradients moved during it."""
        self.pending = False
        vector = self.worker.result() if self.worker is not None else None
        grads, moved = self._grads, self._moved()
        self._grads, self._versions = [], None
        if moved:
            self.off = True
            LOGGER.debug("monitor_client: the optimizer step wrote to the gradients while "
                         "their norms were read beside it: this step has no gradient norm, "
                         "and the next steps are read before the optimizer steps")
            return None
        if vector is None:  # the worker failed or is gone: the gradients are as they were
            self.off = True
            vector = _read(grads, self._dtype)
        return vector

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()

    def _moved(self) -> bool:
        versions = self._versions or []
        return any(g._version != v for g, v in zip(self._grads, versions, strict=True))


def _same(norms: list[torch.Tensor], again: torch.Tensor | None) -> bool:
    """Whether ``again`` holds ``norms`` bit for bit (a NaN norm is the same NaN)."""
    if again is None or not norms:
        return False
    before = torch.stack(norms)
    return before.shape == again.shape and torch.equal(before.view(torch.uint8),
                                                        again.view(torch.uint8))
