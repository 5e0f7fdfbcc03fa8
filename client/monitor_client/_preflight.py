"""Pre-flight: will this run fit in the device's memory? Said once, at the start.

Estimated need = what is allocated when ``watch()`` is called (the parameters, anything
else already on the device) + gradients (one per trainable parameter, its own dtype) +
the optimizer's state (the tensors it actually created on its first step: Adam's two
moments, SGD's momentum buffer, whatever an optimizer keeps, in their real dtypes and
shapes) + activations (the first step's peak allocation above everything that persists;
on CPU the probe's peak is the process's peak RSS, a coarser figure).

Warned when the need is above ``HEADROOM`` (90%) of the device total: the caching
allocator fragments, and an allocator that is out of blocks fails well before every byte
is in use. Before the first step only parameters and gradients are known; if those alone
exceed the total, that is said at once.

Every number comes from a ``MemoryProbe`` (``_memory.py``: ``read()`` -> allocated, peak,
total bytes), so a test fakes the device at that boundary.

An 80 GiB device (a fake probe) with 40 GiB resident at ``watch()``, whose first step peaks
at 75 GiB::

    >>> import torch
    >>> from types import SimpleNamespace
    >>> gib = 1 << 30
    >>> probe = SimpleNamespace(read=lambda: {"allocated_bytes": 40 * gib,
    ...                                       "peak_allocated_bytes": 75 * gib,
    ...                                       "total_bytes": 80 * gib})
    >>> model = torch.nn.Linear(256, 256)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    >>> pre = Preflight(model, probe, warn=print)   # at watch(): params + grads fit
    >>> model(torch.ones(1, 256)).sum().backward()
    >>> opt.step()
    >>> pre.after_first_step(opt)["need"] / gib     # + optimizer state + activations
    pre-flight: this run needs about 75.00 GiB of 80.00 GiB device memory (...): above 90%, ...
    75.0
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

HEADROOM = 0.9
GIB = float(1 << 30)


def tensor_bytes(t: Any) -> int:
    return int(t.numel()) * int(t.element_size())


def optimizer_state_bytes(optimizer: Any) -> int:
    """Bytes of every tensor in ``optimizer.state`` (shapes and dtypes only: no sync)."""
    total = 0
    for state in list(getattr(optimizer, "state", {}).values()):
        for value in list(state.values()) if isinstance(state, dict) else ():
            if hasattr(value, "numel") and hasattr(value, "element_size"):
                total += tensor_bytes(value)
    return total


class Preflight:
    """One run's memory estimate against the device total (see module docstring)."""

    def __init__(self, model: Any, probe: Any, warn: Callable[[str], None]) -> None:
        self.probe, self.warn = probe, warn
        self.grad_bytes = sum(tensor_bytes(p) for p in model.parameters() if p.requires_grad)
        self.param_bytes = sum(tensor_bytes(p) for p in model.parameters())
        start = probe.read() if probe is not None else {}
        self.total = start.get("total_bytes")
        self.base = start.get("allocated_bytes") or self.param_bytes
        self.estimate: dict[str, int] | None = None
        self.done = False
        if self.total and self.base + self.grad_bytes > self.total:
            self.done = True
            self.warn(f"pre-flight: parameters and gradients alone need "
                      f"{_gib(self.base + self.grad_bytes)} of {_gib(self.total)} device "
                      f"memory; this run will not fit")

    def after_first_step(self, optimizer: Any) -> dict[str, int] | None:
        """Estimate from the first step's measurements; warn once if it will not fit."""
        if self.done or self.probe is None:
            return None
        self.done = True
        now = self.probe.read()
        total = now.get("total_bytes") or self.total
        state = optimizer_state_bytes(optimizer)
        persistent = self.base + self.grad_bytes + state
        peak = now.get("peak_allocated_bytes") or 0
        acts = max(int(peak) - persistent, 0)
        need = persistent + acts
        self.estimate = {"parameters_and_resident": int(self.base), "gradients": self.grad_bytes,
                         "optimizer_state": state, "activations": acts, "need": need,
                         "total": int(total) if total else 0}
        if total and need > HEADROOM * total:
            self.warn(f"pre-flight: this run needs about {_gib(need)} of {_gib(total)} "
                      f"device memory (resident at watch {_gib(self.base)}, gradients "
                      f"{_gib(self.grad_bytes)}, optimizer state {_gib(state)}, "
                      f"activations {_gib(acts)}): above {HEADROOM:.0%}, it will not fit "
                      f"once the allocator fragments or a longer batch comes")
        return self.estimate


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"
