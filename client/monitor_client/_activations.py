"""Activation statistics: forward hooks that exist only for monitored steps.

``ActivationStats`` picks modules of a model (by default its nonlinearities, see
``default_filter``) and, every ``every`` optimizer steps, measures each one's OUTPUT on
that step's first training forward: mean, std, max-abs, fraction of exact zeros,
non-finite count and, for zero-clamping activations (ReLU, ReLU6), the dead fraction: the
share of units (last dimension; channels, dim 1, for 4-D/5-D conv maps) that are exactly
zero for every sample of the batch.

Cost model: the hooks are registered only when a monitored step is next (at ``attach()``
for step 0, then from the optimizer's post-hook of the step before one) and each hook
removes itself after it fired once, so unmonitored steps run with no hook at all, and with
gradient accumulation only the first micro-batch is measured. Forwards in eval mode
(``module.training`` False) are skipped, so a validation pass between steps is not
mistaken for the training batch. Statistics are 0-d device tensors (no ``.item()``): they
join the step's ``StatsPack`` and reach the host in its one copy, in the sender thread.

Step 0 of ``every=2``: the ReLU's output is measured on the first forward, then the hook is
gone; its statistics join the step's pack at ``log_step``::

    >>> from monitor_client._stats import StatsPack
    >>> model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
    >>> acts = ActivationStats(model, opt, every=2).attach()
    >>> model(torch.ones(3, 4)).sum().backward()
    >>> acts.armed                # fired once and removed itself
    False
    >>> opt.step()                # step 0 ends; step 1 is not monitored: no hook is armed
    >>> acts.armed
    False
    >>> pack = StatsPack()
    >>> acts.add_to(pack)         # at log_step: this step's measurements, no tensor op
    >>> sorted(pack.decode(pack.vector().tolist())["activations"]["1"])
    ['dead_frac', 'max_abs', 'mean', 'nonfinite', 'std', 'zero_frac']
    >>> acts.detach()             # every hook removed, optimizer's included

``measure`` on a known output (mean, std, max-abs, zero fraction, dead fraction,
non-finite count): unit (column) 0 is zero for every sample, so half the units are dead::

    >>> measure(torch.tensor([[0.0, 2.0], [0.0, 4.0]]), dead=True).tolist()
    [1.5, 1.658..., 4.0, 0.5, 0.5, 0.0]
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from monitor_client._hooks import Hooks
from monitor_client._model_info import user_modules

FIELDS = ("mean", "std", "max_abs", "zero_frac", "dead_frac", "nonfinite")
DEFAULT_MAX_MODULES = 64

# Outputs exactly zero below a threshold: "dead" units are meaningful for these only.
ZERO_CLAMPING: tuple[type[nn.Module], ...] = (nn.ReLU, nn.ReLU6)
DEFAULT_TYPES: tuple[type[nn.Module], ...] = (
    nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.PReLU, nn.RReLU, nn.ELU, nn.SELU, nn.CELU, nn.GELU,
    nn.SiLU, nn.Mish, nn.Hardswish, nn.Softplus, nn.Tanh,
)

Filter = Callable[[str, nn.Module], bool]


def default_filter(name: str, module: nn.Module) -> bool:
    """torch's nonlinearity modules, plus classes named ``*Activation`` (transformers'
    ``NewGELUActivation``, ``GELUActivation`` ...): one hook per MLP, the cheap default."""
    return isinstance(module, DEFAULT_TYPES) or type(module).__name__.endswith("Activation")


def make_filter(which: bool | tuple | type | Filter) -> Filter:
    """``True``: the default; a type or tuple of types: isinstance; else a callable
    ``(name, module) -> bool``."""
    if which is True:
        return default_filter
    if isinstance(which, type | tuple):
        types = which
        return lambda name, module: isinstance(module, types)
    if callable(which):
        return which
    raise TypeError(f"activations= takes True, module types or a callable, not {which!r}")


def zero_clamping(module: nn.Module) -> bool:
    return isinstance(module, ZERO_CLAMPING)


@torch.no_grad()
def measure(x: torch.Tensor, dead: bool) -> torch.Tensor:
    """The six statistics of one output as a float32 vector on its device (no sync)."""
    x = x.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float()  # bf16/fp16 sums would lose the very precision we report
    n = x.numel()
    var, mean = torch.var_mean(x, correction=0)
    lo, hi = torch.aminmax(x)
    zero = 1.0 - torch.count_nonzero(x) / n
    nonfinite = n - torch.isfinite(x).sum()
    if dead and x.dim() >= 2:
        unit = 1 if x.dim() in (4, 5) else x.dim() - 1
        dims = tuple(d for d in range(x.dim()) if d != unit)
        dead_frac = 1.0 - x.ne(0).any(dim=dims).float().mean()
    else:
        dead_frac = torch.full((), math.nan, device=x.device)
    return torch.stack([mean, var.sqrt(), torch.maximum(-lo, hi), zero, dead_frac,
                        nonfinite.float()]).float()


def decode(names: tuple[str, ...], chunk: list[float]) -> dict[str, Any]:
    """One module's host numbers to its wire entry (dead_frac null when not measured)."""
    entry: dict[str, float | None] = dict(zip(FIELDS, chunk, strict=True))
    if entry["dead_frac"] != entry["dead_frac"]:
        entry["dead_frac"] = None
    return entry


class ActivationStats:
    """Forward hooks on chosen modules for monitored steps only; see the module docstring.

    Which modules: the default nonlinearities, module types, or a ``(name, module)`` filter::

        >>> model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 8), nn.ReLU())
        >>> opt = torch.optim.SGD(model.parameters(), lr=0.1)
        >>> ActivationStats(model, opt).names, ActivationStats(model, opt, modules=nn.ReLU).names
        (['1', '3'], ['3'])
        >>> ActivationStats(model, opt, modules=lambda name, m: isinstance(m, nn.Linear)).names
        ['0', '2']
    """

    def __init__(self, model: nn.Module, optimizer: Any, *, every: int = 25,
                 modules: bool | tuple | type | Filter = True,
                 max_modules: int = DEFAULT_MAX_MODULES, prefix: str = "") -> None:
        keep = make_filter(modules)
        chosen = [(n, m) for n, m in user_modules(model) if n and keep(n, m)]
        self.skipped = max(len(chosen) - max_modules, 0)  # beyond the cap: not hooked
        chosen = chosen[:max_modules]
        # ``prefix``: the model's name when a run watches several (``Monitor.watch(name=)``)
        self.names = [f"{prefix}.{n}" if prefix else n for n, _ in chosen]
        self.modules = [m for _, m in chosen]
        self.every = max(1, int(every))
        self._optimizer = optimizer
        self._hooks = Hooks()  # the optimizer's; the modules' forward hooks are _armed
        self._armed: dict[int, Any] = {}
        self._found: dict[int, torch.Tensor] = {}
        self._steps = 0

    @property
    def armed(self) -> bool:
        return bool(self._armed)

    def attach(self) -> ActivationStats:
        self._hooks.around_step(self._optimizer, after=self.after_step)
        if self._steps % self.every == 0:
            self.arm()
        return self

    def after_step(self) -> None:
        # Hooks still here belong to modules the forward never called: drop them, so the
        # steps until the next monitored one run hook-free.
        self.disarm()
        self._steps += 1
        if self._steps % self.every == 0:
            self.arm()

    def arm(self) -> None:
        for i, module in enumerate(self.modules):
            if i not in self._armed:
                self._armed[i] = module.register_forward_hook(self._hooks.guard(self._hook(i)))

    def disarm(self) -> None:
        for handle in self._armed.values():
            handle.remove()
        self._armed.clear()

    def detach(self) -> None:
        """Remove every hook (forward and optimizer); nothing of ours stays on the model."""
        self.disarm()
        self._hooks.remove()

    def _hook(self, i: int) -> Callable:
        dead = zero_clamping(self.modules[i])

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not module.training:
                return  # an eval pass between steps: wait for the training forward
            out = output[0] if isinstance(output, tuple | list) and output else output
            if isinstance(out, torch.Tensor) and out.is_floating_point() and out.numel():
                self._found[i] = measure(out, dead)
            handle = self._armed.pop(i, None)  # fired once: gone until the next monitored step
            if handle is not None:
                handle.remove()

        return hook

    def add_to(self, pack: Any) -> None:
        """Hand this step's measurements to ``pack`` (a StatsPack); no tensor op here."""
        found, self._found = self._found, {}
        for i in sorted(found):
            pack.add("activation", found[i], layers=[self.names[i]])
