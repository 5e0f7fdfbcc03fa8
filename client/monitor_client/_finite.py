"""Where a forward pass went non-finite: one float32 sum per module output, every step.

A NaN born in the forward pass poisons the loss and then EVERY gradient, upstream and
downstream alike, so the gradients cannot say where it was born. The outputs can: the first
module, in the order the forward pass ran them, whose output holds a NaN or an infinity is
where it appeared (or the first one that saw it: non-module code between two modules, such
as a ``softmax`` written inline, is named by the next module that consumes its result).

``FiniteFlags(full=True)`` puts a forward hook on every leaf module (no children; at most
``max_modules`` of them, in registration order) except those that cannot turn finite
inputs into a non-finite output: dropout, identity and the elementwise activations
(ReLU family, GELU, SiLU, tanh, sigmoid, ... and classes named ``*Activation`` /
``*Dropout``). Their output is non-finite only when their input already was, so the module
before them (or the one after, for inline code) names the origin as well, and a
transformer block needs 6 hooks instead of 10. By default (``unit_modules``) each element
of a ``ModuleList``, a model's repeated blocks, is hooked as one unit instead, with the
leaves outside the blocks. On a training forward the hook queues a float32 sum of the
output (below: of all of it, or of a sample): no host sync, no boolean temporary. A sum
is non-finite exactly when some element is (NaN and inf propagate), except when finite
values overflow float32 together, i.e. elements already near 1e38 - an output that is
effectively infinite anyway. The sums join the step's ``StatsPack`` and reach the host with
its one copy, in the sender thread, where ``decode`` keeps only the modules whose sum is
non-finite, in forward order (the order the hooks first fired this step). With gradient
accumulation each micro-batch adds its own sum, so a NaN in any of them shows.

**What is summed.** ``full=True`` sums every element: the exact first module, at the price
of one read of every hooked output each step. That read is the cost: on a GPT-2-small
step in bf16 (batch 8 x 1024) it is about 2.9 GB, 1.3 ms of an H100's 43 ms step (3%;
bench/gpu_check.py), and a check that reads every element cannot cost less than reading
it. By default (``full=False``) the hook sums each *row's* first 32 bytes (the leading
16 bf16 or 8 float32 features of every token; a row is everything but the last
dimension): one memory sector per row, about 1/50 of those bytes, in one small
reduction a module (the rows' sums) and, at ``log_step``, one fused call for every
module's rows (``add_to``: their L1 norms, non-finite exactly when a sampled row is).
The reasoning: the non-finite values a forward makes are whole rows in the shapes
that cause them - a bad input row, a norm of a row that overflowed, a softmax row that
went NaN, attention spreading a bad key to every later query, any linear map fed a bad
row - and a whole row is seen in its first features, so the first sampled module that
went non-finite is the one that made it. A value confined to some features of a row (an
fp16 overflow in a few of a linear layer's outputs, a non-finite weight row) is seen
where a module first mixes features (a linear layer, a norm, attention): usually the
next hooked module. The record says which check it was (``nonfinite_check``), and the
sidecar words its finding to match: only a full check can say that every output was
finite.

**Held on the CPU.** A sum is needed only on a step whose loss or gradient is not finite:
the sidecar reads ``nonfinite_modules`` only there (detectors/nan_inf.py), and on every
other step the report is dropped (``_pending.drop_finite_report``). On the CPU, where
the host can see the loss and the gradient norms for free, the hook therefore holds a
reference to the output instead of summing it (no tensor op: a few hundred nanoseconds
against a torch call's several microseconds), and ``add_to`` either drops the held
outputs (``clean``: the step's loss and gradient norm are finite on the host) or sums
them then, with the same read (``sampled`` or ``full``) the hook would have made. On a
step of a few milliseconds the eager sums were 4-6% of the step (bench/tiny_steps.py).
An output held past ``HOLD_BYTES`` in all, and every output on a GPU (there the loss is
on the device: reading it is a sync), is summed at once, as before. What this gives
up: an output that later code changes in place (an in-place clamp or ``masked_fill_``
of a module's output) is read as changed, and an in-place clamp can hide an infinity
that the eager sum saw (NaN survives every in-place activation).

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
    {'nonfinite_modules': ['1', '3'], 'nonfinite_module_count': 2, 'nonfinite_check': 'sampled'}
    >>> flags.detach()

A step whose outputs were all finite reports that (count 0), and the record keeps it only
when the loss is not finite (``_pending.drop_finite_report``): then the loss arithmetic
made it::

    >>> decode(("0", "1"), [1.5, -2.0])
    {'nonfinite_module_count': 0, 'nonfinite_check': 'full'}

The sample of a (batch, tokens, features) bf16 output is every token's first 16
features::

    >>> sample(torch.zeros(2, 5, 768, dtype=torch.bfloat16)).shape
    torch.Size([2, 5, 16])
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from monitor_client._hooks import Hooks
from monitor_client._model_info import user_modules

DEFAULT_MAX_MODULES = 512
# An output this small is summed whole even when sampling: one reduction instead of a
# slice and two, and exact. On a CPU core the sampled sum's three calls cost as much as
# reading about 150,000 float32 elements whole (measured: 131,072 elements whole in half
# the sampled time, 262,144 in 1.5x it); on a GPU reading 512 KiB is a fraction of a
# microsecond of device time and one launch instead of two. So the sampled check's price
# is unchanged where it matters (a transformer block's output: millions of elements) and
# lower, and exact, on the small outputs of small models.
WHOLE_ELEMENTS = 1 << 17
MAX_NAMED = 32  # modules named in a record; the count says how many there were
# Host memory a step's held outputs may keep alive past their use, in all (see "Held on the
# CPU" in the module docstring): one step of a small model's hooked outputs, where the
# check's fixed price per hook is what shows; an output past it is summed at once.
HOLD_BYTES = 64 << 20
SAMPLE_BYTES = 32  # of each row, when sampled: one memory sector (see the module docstring)


def on_host(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` can be read by the host for free (a CPU tensor): then a step's
    checks are read on the training thread (held outputs, ``GradStats.grads_finite``);
    on a device they stay there until the sender's one copy. The one place that decides
    (the tests run the device path on CPU tensors by replacing it)."""
    return tensor.is_cpu


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
    leaves = [(n, m) for n, m in user_modules(model)
              if not any(True for _ in m.children()) and can_originate(m)]
    return leaves or [("", model)]


def unit_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """What the sampled check hooks: each element of a ``ModuleList`` (a model's repeated
    blocks, e.g. ``blocks.3``) as one unit, and every leaf outside those units that can
    create a non-finite value. A block mixes features (linear maps, norms, attention), so
    what went non-finite inside it reaches its output in whole rows; a GPT-2 needs 16
    hooks instead of 76."""
    units: list[tuple[str, nn.Module]] = []
    covered: set[int] = set()
    for name, module in user_modules(model):
        if id(module) in covered:
            continue
        if isinstance(module, nn.ModuleList):
            for child_name, child in module.named_children():
                units.append((f"{name}.{child_name}" if name else child_name, child))
                covered.update(id(m) for m in child.modules())
            continue
        if not any(True for _ in module.children()) and can_originate(module):
            units.append((name, module))
    return units or [("", model)]


def decode(names: tuple[str, ...], sums: list[float], check: str = "full") -> dict[str, Any]:
    """The wire fields for one step's host sums (``check``: ``"full"`` or ``"sampled"``).
    Every output finite is a measurement too (``nonfinite_module_count`` 0: after a full
    check, a NaN loss was made in the loss arithmetic); ``_pending.drop_finite_report``
    keeps it only on the steps where it says something."""
    # dict.fromkeys: a module fires once per micro-batch; keep its first place.
    bad = list(dict.fromkeys(n or "<model>" for n, s in zip(names, sums, strict=True)
                             if not math.isfinite(s)))
    if not bad:
        return {"nonfinite_module_count": 0, "nonfinite_check": check}
    return {"nonfinite_modules": bad[:MAX_NAMED], "nonfinite_module_count": len(bad),
            "nonfinite_check": check}


def sample(out: torch.Tensor) -> torch.Tensor:
    """Each row's first ``SAMPLE_BYTES`` of ``out`` (a view: nothing is copied); the whole
    tensor when its rows are no longer than that."""
    width = max(SAMPLE_BYTES // out.element_size(), 1)
    return out[..., :width] if out.dim() > 1 and out.shape[-1] > width else out


class FiniteFlags:
    """Forward hooks recording each hooked module's output sum; see the module docstring.

    Several models (a GAN's generator and discriminator) share one: their modules' sums
    land in the order the forward passes ran them, whichever model they belong to, so the
    first non-finite output is found across models too (``add_model``, names prefixed with
    the model's name)."""

    def __init__(self, model: nn.Module, max_modules: int = DEFAULT_MAX_MODULES,
                 full: bool = False, prefix: str = "", hold: bool = True) -> None:
        self.full = full
        self.hold = hold  # hold CPU outputs until add_to (module docstring); False: sum now
        self._held: list[int] = []  # positions in _sums that hold an output, not its sum
        self._held_bytes = 0
        self.max_modules = max_modules
        self.skipped = 0
        self.names: list[str] = []
        self.modules: list[nn.Module] = []
        self._hooks = Hooks()
        self._attached = False
        self._sums: list[torch.Tensor] = []  # one per firing, aligned with _fired
        self._fired: list[int] = []
        self.add_model(model, prefix)

    def add_model(self, model: nn.Module, prefix: str = "") -> None:
        """Check ``model``'s modules too (named ``prefix.name``), within ``max_modules``."""
        chosen = leaf_modules(model) if self.full else unit_modules(model)
        room = max(self.max_modules - len(self.modules), 0)
        self.skipped += max(len(chosen) - room, 0)
        start = len(self.modules)
        for name, module in chosen[:room]:
            self.names.append(f"{prefix}.{name}" if prefix and name else prefix or name)
            self.modules.append(module)
        if self._attached:
            self._hook_modules(start)

    @property
    def check(self) -> str:
        """What the record says was read: ``"full"`` or ``"sampled"``."""
        return "full" if self.full else "sampled"

    def attach(self) -> FiniteFlags:
        self._attached = True
        self._hook_modules(0)
        return self

    def _hook_modules(self, start: int) -> None:
        self._hooks.add(*(self.modules[i].register_forward_hook(self._hooks.guard(self._hook(i)))
                          for i in range(start, len(self.modules))))

    def detach(self) -> None:
        self._hooks.remove()
        self._attached = False
        self._sums, self._fired, self._held, self._held_bytes = [], [], [], 0

    def _hook(self, i: int) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not module.training:
                return
            out = output[0] if isinstance(output, (tuple, list)) and output else output
            # (an empty output sums to 0: finite, so no numel() call for it)
            if isinstance(out, torch.Tensor) and out.dtype.is_floating_point:
                if self.hold and on_host(out):
                    size = out.nbytes
                    if self._held_bytes + size <= HOLD_BYTES:
                        self._held_bytes += size
                        self._held.append(len(self._sums))
                        self._sums.append(out)  # summed at add_to, if the step needs it
                        self._fired.append(i)
                        return
                self._sums.append(self._partial(out.detach()))
                self._fired.append(i)

        return hook

    @property
    def holding(self) -> bool:
        """Whether outputs of this step wait for ``add_to`` unsummed."""
        return bool(self._held)

    def _partial(self, out: torch.Tensor) -> torch.Tensor:
        """A 0-d sum of ``out``, or, sampled, the sum of each sampled row: one reduction
        here, the rows' total taken by ``add_to`` for every module of the step at once."""
        if self.full or out.ndim < 2 or out.numel() <= WHOLE_ELEMENTS:
            return out.sum(dtype=_sum_dtype(out))
        # Rows first: one reduction over a strided view of 32-byte rows in one go ran 8-22 us
        # a module on an H100 (a poor launch shape); a contiguous row sum is a few.
        return sample(out).sum(-1, dtype=_sum_dtype(out))

    def add_to(self, pack: Any, clean: bool = False) -> None:
        """Hand this step's sums to ``pack`` in firing order; no tensor op here unless
        outputs were held or rows sampled: held outputs are summed now, unless the step is
        ``clean`` (its loss and gradients are finite on the host, so no module report is
        read); sampled rows get their totals."""
        sums, fired, held = self._sums, self._fired, self._held
        self._sums, self._fired, self._held, self._held_bytes = [], [], [], 0
        if clean:
            return
        with torch.no_grad():
            for at in held:
                sums[at] = self._partial(sums[at].detach())
            rows = [at for at, s in enumerate(sums) if s.ndim]
            if rows:
                # Every sampled module's rows in one fused call (two kernels on a GPU, not
                # one reduction a module: 16 fewer launches a GPT-2 step). An L1 norm, not a
                # sum: non-finite exactly when a row is (NaN and inf survive abs and
                # addition), and only finiteness is read.
                totals = torch._foreach_norm([sums[at] for at in rows], 1)
                for at, total in zip(rows, totals, strict=True):
                    sums[at] = total
        if sums:
            pack.add_each("output_sum", sums, [self.names[i] for i in fired])
            pack.finite_check = self.check


def _sum_dtype(out: torch.Tensor) -> torch.dtype:
    """float32, or float64 for a float64 output (a sum may not narrow it: torch refuses, and
    float32 would turn its values past 3.4e38 into a false infinity)."""
    return torch.float64 if out.dtype == torch.float64 else torch.float32
