"""Where a forward pass went non-finite: one float32 sum per module output, every step.

A NaN born in the forward pass poisons the loss and then EVERY gradient, upstream and
downstream alike, so the gradients cannot say where it was born. The outputs can: the first
module, in the order the forward pass ran them, whose output holds a NaN or an infinity is
where it appeared (or the first one that saw it: non-module code between two modules, such
as a ``softmax`` written inline, is named by the next module that consumes its result).

``FiniteFlags`` puts a forward hook on every leaf module (no children; at most
``max_modules`` of them, in registration order) except those that cannot turn finite
inputs into a non-finite output: dropout, identity and the elementwise activations
(ReLU family, GELU, SiLU, tanh, sigmoid, ... and classes named ``*Activation`` /
``*Dropout``). Their output is non-finite only when their input already was, so the module
before them (or the one after, for inline code) names the origin as well, and a
transformer block needs 6 hooks instead of 10. On a training forward the hook queues
``out.sum(dtype=float32)``: one reduction kernel, no host sync, no boolean temporary. A sum
is non-finite exactly when some element is (NaN and inf propagate), except when finite
values overflow float32 together, i.e. elements already near 1e38 - an output that is
effectively infinite anyway. The sums join the step's ``StatsPack`` and reach the host with
its one copy, in the sender thread, where ``decode`` keeps only the modules whose sum is
non-finite, in forward order (the order the hooks first fired this step). With gradient
accumulation each micro-batch adds its own sum, so a NaN in any of them shows.

Eval-mode forwards are skipped: a validation pass between steps is not the training batch.

A NaN born in module ``1`` (a square root of a negative value): it and every module after
it are non-finite, named in forward order, the origin first::

    >>> from monitor_client._stats import StatsPack
    >>> class Sqrt(nn.Module):
    ...     def forward(self, x):
    ...         return x.sqrt()
    >>> model = nn.Sequential(nn.LayerNorm(2), Sqrt(), nn.ReLU(), nn.Linear(2, 1))
    >>> flags = FiniteFlags(model).attach()
    >>> flags.names                           # a ReLU cannot create a NaN: not hooked
    ['0', '1', '3']
    >>> _ = model(torch.tensor([[1.0, 3.0]]))  # LayerNorm: [-1, 1]; sqrt(-1) is NaN
    >>> pack = StatsPack()
    >>> flags.add_to(pack)                    # at log_step: this step's sums, no tensor op
    >>> pack.decode(pack.vector().tolist())   # after the step's one host copy
    {'nonfinite_modules': ['1', '3'], 'nonfinite_module_count': 2}
    >>> flags.detach()

A step whose outputs were all finite reports that (count 0), and the record keeps it only
when the loss is not finite (``_pending.drop_finite_report``): then the loss arithmetic
made it::

    >>> decode(("0", "1"), [1.5, -2.0])
    {'nonfinite_module_count': 0}
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from monitor_client._hooks import Hooks

DEFAULT_MAX_MODULES = 512
MAX_NAMED = 32  # modules named in a record; the count says how many there were


# Elementwise maps that send finite values to finite values (and dropout, identity).
FINITE_PRESERVING: tuple[type[nn.Module], ...] = (
    nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.Identity,
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU,
    nn.SiLU, nn.Mish, nn.Hardswish, nn.Hardsigmoid, nn.Hardtanh, nn.Tanh, nn.Sigmoid,
    nn.Softsign, nn.Tanhshrink,
)


def can_originate(module: nn.Module) -> bool:
    """False for modules whose output is non-finite only if their input was."""
    name = type(module).__name__
    return not (isinstance(module, FINITE_PRESERVING) or name.endswith(("Activation", "Dropout")))


def leaf_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Modules without children (where the computation is) that can create a non-finite
    value; the root if there is none."""
    leaves = [(n, m) for n, m in model.named_modules()
              if not any(True for _ in m.children()) and can_originate(m)]
    return leaves or [("", model)]


def decode(names: tuple[str, ...], sums: list[float]) -> dict[str, Any]:
    """The wire fields for one step's host sums. Every output finite is a measurement too
    (``nonfinite_module_count`` 0: a NaN loss was then made in the loss arithmetic);
    ``_pending.drop_finite_report`` keeps it only on the steps where it says something."""
    # dict.fromkeys: a module fires once per micro-batch; keep its first place.
    bad = list(dict.fromkeys(n or "<model>" for n, s in zip(names, sums, strict=True)
                             if not math.isfinite(s)))
    if not bad:
        return {"nonfinite_module_count": 0}
    return {"nonfinite_modules": bad[:MAX_NAMED], "nonfinite_module_count": len(bad)}


class FiniteFlags:
    """Forward hooks recording each leaf module's output sum; see the module docstring."""

    def __init__(self, model: nn.Module, max_modules: int = DEFAULT_MAX_MODULES) -> None:
        chosen = leaf_modules(model)
        self.skipped = max(len(chosen) - max_modules, 0)
        chosen = chosen[:max_modules]
        self.names = [n for n, _ in chosen]
        self.modules = [m for _, m in chosen]
        self._hooks = Hooks()
        self._sums: list[torch.Tensor] = []  # one per firing, aligned with _fired
        self._fired: list[int] = []

    def attach(self) -> FiniteFlags:
        self._hooks.add(*(m.register_forward_hook(self._hook(i))
                          for i, m in enumerate(self.modules)))
        return self

    def detach(self) -> None:
        self._hooks.remove()

    def _hook(self, i: int) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not module.training:
                return
            out = output[0] if isinstance(output, tuple | list) and output else output
            # (an empty output sums to 0: finite, so no numel() call for it)
            if isinstance(out, torch.Tensor) and out.dtype.is_floating_point:
                self._sums.append(out.detach().sum(dtype=torch.float32))
                self._fired.append(i)

        return hook

    def add_to(self, pack: Any) -> None:
        """Hand this step's sums to ``pack`` in firing order; no tensor op here."""
        sums, fired = self._sums, self._fired
        self._sums, self._fired = [], []
        if sums:
            pack.add_each("output_sum", sums, [self.names[i] for i in fired])
