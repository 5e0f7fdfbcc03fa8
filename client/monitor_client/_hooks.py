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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["Hooks"]


class Hooks:
    """Removable hook handles (anything with ``remove()``), removed together."""

    __slots__ = ("_handles",)

    def __init__(self) -> None:
        self._handles: list[Any] = []

    def add(self, *handles: Any) -> None:
        self._handles.extend(handles)

    def around_step(self, optimizer: Any, before: Callable[[], Any] | None = None,
                    after: Callable[[], Any] | None = None) -> Hooks:
        """Call ``before()`` as ``optimizer.step`` begins and ``after()`` once it returned
        (torch's step pre- and post-hooks, whose arguments these callbacks do not need)."""
        if before is not None:
            self.add(optimizer.register_step_pre_hook(lambda *_: before()))
        if after is not None:
            self.add(optimizer.register_step_post_hook(lambda *_: after()))
        return self

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def __len__(self) -> int:
        return len(self._handles)
