"""``Hooks``: the handles of the hooks one measurement puts on torch objects (a model, its
modules and parameters, an optimizer), removed together.

Every part of the client that hooks torch keeps its handles in one (``_stats.py``,
``_guard.py``, ``_timings.py``, ``_finite.py``, ``_activations.py``, ``_phase.py``, the HF
callback), so detaching is one call that leaves nothing of ours behind, and detaching
twice, or before attaching, is harmless::

    >>> import torch
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> steps = []
    >>> hooks = Hooks().around_step(opt, after=lambda: steps.append("stepped"))
    >>> hooks.add(model.register_forward_hook(lambda *_: steps.append("forward")))
    >>> model(torch.ones(1, 2)).sum().backward(); opt.step()
    >>> steps, len(hooks)
    (['forward', 'stepped'], 2)
    >>> hooks.remove(); hooks.remove()
    >>> model(torch.ones(1, 2)).sum().backward(); opt.step()
    >>> steps, len(hooks)
    (['forward', 'stepped'], 0)

A hook runs inside the user's ``forward()`` or ``optimizer.step()``, where an exception
would end the training, so every callable goes through ``guard()``: a failure costs that
call's measurement, is logged once per hooked function with its traceback (a bug must
still be seen) and counted in ``errors``; later failures of the same function are only
counted::

    >>> hooks = Hooks()
    >>> hooks.add(model.register_forward_hook(hooks.guard(lambda *_: 1 / 0)))
    >>> for _ in range(3):
    ...     _ = model(torch.ones(1, 2))          # the forward runs; the hook's error is kept
    >>> hooks.errors
    3
    >>> hooks.remove()
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from monitor_client._warn import LOGGER

__all__ = ["Hooks"]


class Hooks:
    """Removable hook handles (anything with ``remove()``), removed together; and the
    failures of the hooks they hold, contained (``guard``)."""

    __slots__ = ("_handles", "errors", "_logged")

    def __init__(self) -> None:
        self._handles: list[Any] = []
        self.errors = 0             # hook calls that raised (each one contained)
        self._logged: set[str] = set()

    def add(self, *handles: Any) -> None:
        self._handles.extend(handles)

    def guard(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` as a hook that never raises into the training step (module docstring)."""

        @functools.wraps(fn)
        def hook(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except Exception:  # noqa: BLE001 - monitoring must never break training
                self._failed(fn)
                return None

        return hook

    def _failed(self, fn: Callable[..., Any]) -> None:
        self.errors += 1
        name = getattr(fn, "__qualname__", repr(fn))
        if name not in self._logged:
            self._logged.add(name)
            LOGGER.warning("monitor_client: the hook %s failed; its measurement is skipped "
                           "and training goes on (reported once; please report it as a bug)",
                           name, exc_info=True)

    def around_step(self, optimizer: Any, before: Callable[[], Any] | None = None,
                    after: Callable[[], Any] | None = None) -> Hooks:
        """Call ``before()`` as ``optimizer.step`` begins and ``after()`` once it returned
        (torch's step pre- and post-hooks, whose arguments these callbacks do not need)."""
        if before is not None:
            self.add(optimizer.register_step_pre_hook(self.guard(_no_arguments(before))))
        if after is not None:
            self.add(optimizer.register_step_post_hook(self.guard(_no_arguments(after))))
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __len__(self) -> int:
        return len(self._handles)


def _no_arguments(fn: Callable[[], Any]) -> Callable[..., Any]:
    """``fn`` called without the hook's arguments (named as ``fn`` in a failure's log)."""

    @functools.wraps(fn)
    def call(*_: Any) -> Any:
        return fn()

    return call
