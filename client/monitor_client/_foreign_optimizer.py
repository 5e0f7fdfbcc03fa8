"""An optimizer that is not a ``torch.optim.Optimizer`` (a hand-written class with ``step()``
and ``param_groups``, an older library's), given the two step hooks the client hooks.

The client measures, clips and guards in torch's optimizer step hooks
(``register_step_pre_hook`` / ``register_step_post_hook``). A class of the user's own has
``step()`` but not those; without them ``watch(model, opt, grad_clip=1.0)`` measured
nothing and clipped nothing, said in one warning about a missing attribute. So the
instance gets them: its ``step`` is wrapped on the instance (the class is left alone) to
call the pre-hooks with the step's arguments, the step, then the post-hooks, as torch's
own wrapper does; the handles remove a hook. An optimizer without ``param_groups`` (where
the parameters and their learning rates live) or whose attributes cannot be set is not
one the client can hook: ``hookable`` says why, and ``watch()`` watches the model as a
loop without an optimizer (the gradients read at ``log_step``; nothing clipped, said so).

    >>> import torch
    >>> class SignSGD:
    ...     def __init__(self, params, lr):
    ...         self.param_groups = [{"params": list(params), "lr": lr}]
    ...     def step(self):
    ...         for p in self.param_groups[0]["params"]:
    ...             p.data.add_(p.grad.sign(), alpha=-self.param_groups[0]["lr"])
    >>> w = torch.nn.Parameter(torch.ones(2))
    >>> opt = SignSGD([w], lr=0.5)
    >>> hookable(opt)
    ''
    >>> seen = []
    >>> handle = opt.register_step_pre_hook(lambda o, args, kwargs: seen.append("pre"))
    >>> _ = opt.register_step_post_hook(lambda o, args, kwargs: seen.append("post"))
    >>> w.grad = torch.tensor([1.0, -1.0])
    >>> opt.step()
    >>> seen, w.tolist()
    (['pre', 'post'], [0.5, 1.5])
    >>> handle.remove(); opt.step(); seen
    ['pre', 'post', 'post']
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

__all__ = ["hookable"]

_ids = itertools.count()


class _Handle:
    def __init__(self, hooks: dict[int, Callable[..., Any]], key: int) -> None:
        self._hooks, self._key = hooks, key

    def remove(self) -> None:
        self._hooks.pop(self._key, None)


def hookable(optimizer: Any) -> str:
    """Give ``optimizer`` torch's two step-hook methods if it lacks them; '' when it has
    them (now or before), else why it cannot have them."""
    if hasattr(optimizer, "register_step_pre_hook") and hasattr(optimizer,
                                                                "register_step_post_hook"):
        return ""
    if not callable(getattr(optimizer, "step", None)):
        return "it has no step() method"
    groups = getattr(optimizer, "param_groups", None)
    if not isinstance(groups, list | tuple) or not all(
            isinstance(g, dict) and "params" in g for g in groups):
        return "it has no param_groups (a list of dicts with 'params', as torch.optim's)"
    pre: dict[int, Callable[..., Any]] = {}
    post: dict[int, Callable[..., Any]] = {}
    step = optimizer.step

    @functools.wraps(step)
    def stepped(*args: Any, **kwargs: Any) -> Any:
        # torch's hooks get the optimizer first among the step's arguments
        for hook in list(pre.values()):
            hook(optimizer, args, kwargs)
        out = step(*args, **kwargs)
        for hook in list(post.values()):
            hook(optimizer, args, kwargs)
        return out

    def register(hooks: dict[int, Callable[..., Any]], hook: Callable[..., Any]) -> _Handle:
        key = next(_ids)
        hooks[key] = hook
        return _Handle(hooks, key)

    try:
        optimizer.step = stepped
        optimizer.register_step_pre_hook = functools.partial(register, pre)
        optimizer.register_step_post_hook = functools.partial(register, post)
    except (AttributeError, TypeError) as exc:  # __slots__, a frozen class, a property
        return f"its attributes cannot be set ({type(exc).__name__}: {exc})"
    return ""
