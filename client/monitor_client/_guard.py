"""``StepGuard``: skip an optimizer step whose gradient is non-finite or far beyond the run's
own noise, deciding on the device (no host sync on the training step where it can be avoided).

The decision, in the optimizer pre-hook, from the global pre-clip gradient norm ``GradStats``
has just measured (``_stats.py``; divided by the GradScaler's scale when a fused optimizer
sees still-scaled gradients):

- **non-finite** (NaN or inf): skipped, reason ``nonfinite_grad``;
- **outlier**: skipped, reason ``grad_norm_outlier``, when the norm's natural log is more
  than ``k`` noise sigmas above its current level: the median log-norm of the last
  ``level`` taken steps, the noise the robust spread of the step-to-step changes of the
  last ``window`` taken log-norms (at least ``floor``), judged once ``min_history`` are in
  (the numbers are ``GuardSettings``'s, reasoned in ``settings.py``: a gradient norm's noise is
  a spread of ratios, and a skip loses training, so the band is wide: at the defaults
  nothing under 4.5x the level is skipped, and 2 of 61,267 recorded healthy steps were).
  One-sided: a small gradient is never a reason to skip. Skipped norms never enter the
  window, so a burst of spikes cannot widen the band that judges it; nor do all-zero
  gradients (taken, but they say nothing of the norm's level).

The window is a ring buffer of ``window`` float32 log-norms on the gradients' device (NaN
where empty, ``nanmedian`` over it); the write position is a device tensor that advances
only on a taken step, so nothing about the decision is read on the training thread.
``judge`` is the decision itself, a function of the window and one norm
(``bench/guard_precision.py`` replays recorded runs' norms through it).

How the step is skipped, by optimizer:

- **fused** optimizers (``_step_supports_amp_scaling``: Adam/AdamW/SGD/Adagrad with
  ``fused=True``) read a ``found_inf`` tensor attribute and skip the update in the kernel,
  on device, exactly like a GradScaler skip: Adam's step counter is incremented and then
  decremented by ``found_inf`` (torch/optim/adam.py ``_fused_adam``), so state is bit-for-bit
  unchanged. Under a GradScaler the scaler's own ``found_inf`` is already set: ours is added
  to it, and the scaler's is put back after the step. No host sync, except until the
  optimizer has taken its first step: fused SGD allocates its momentum buffers with
  ``empty_like`` on the first step and a ``found_inf`` skip leaves them uninitialised (the
  next step then reads garbage), so until one step was taken the flag is read on the host
  and a skip is done the non-fused way below.
- any other optimizer cannot skip on device, so the flag is read on the host and, when
  set, every gradient is detached from its parameter for the duration of ``step()``
  (``torch.optim`` passes over a parameter whose ``.grad`` is None: no update, no weight
  decay, no step count) and restored after it, so the user's code sees its gradients
  unchanged. On CPU that read costs nothing (CPU kernels have already run when the pre-hook
  returns); on CUDA it is one host sync per step, which ``watch`` warns about once, naming
  ``fused=True`` as the way out. Zeroing the gradients instead would not be exact (Adam's
  moments would decay, its step count and weight decay would advance).

Every rank decides from the same global norm (DDP all-reduces gradients before the step;
``sharded`` all-reduces the norm), so ranks cannot disagree. The decision (a small code:
0 taken, 1 ``nonfinite_grad``, 2 ``grad_norm_outlier``, 3 ``loss_scale``) goes into the
step's ``StatsPack`` and is decoded with its one host copy into ``skipped``/``skip_reason``.

A linear model whose gradient is steady, then one batch scaled x1000, then a NaN::

    >>> from monitor_client._stats import GradStats
    >>> from monitor_client.settings import GuardSettings
    >>> torch.manual_seed(0) and None
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    >>> stats = GradStats(model, opt).attach()
    >>> guard = StepGuard(stats, opt, GuardSettings(min_history=8)).attach()
    >>> reasons = []
    >>> for step in range(12):
    ...     x = torch.randn(256, 4) * (1000.0 if step == 10 else 1.0)
    ...     y = float("nan") if step == 11 else 0.0
    ...     (model(x) - y).pow(2).mean().backward()
    ...     opt.step(); opt.zero_grad()
    ...     pack = stats.take(); guard.add_to(pack)
    ...     reasons.append(pack.decode(pack.vector().tolist()).get("skip_reason"))
    >>> reasons[10:], any(reasons[:10])
    (['grad_norm_outlier', 'nonfinite_grad'], False)
    >>> guard.detach(); stats.detach()
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import torch

from monitor_client._hooks import Hooks
from monitor_client.settings import GuardSettings

__all__ = ["SKIP_REASONS", "StepGuard", "judge", "level_of", "new_window", "skip_reason"]

# The code the device computes, decoded on the host (index = code; 0 = taken).
SKIP_REASONS = (None, "nonfinite_grad", "grad_norm_outlier", "loss_scale")
_MAD_TO_SIGMA = 1.4826  # MAD x this = sigma for a normal distribution
# The least norm whose log is judged: an all-zero gradient is a real step and never an
# outlier (log(0) = -inf would make the comparison NaN-free only by luck).
_TINY = 1e-30


def new_window(config: GuardSettings, device: Any = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """An empty window (``config.window`` NaN log-norms) and its write position."""
    return (torch.full((config.window,), float("nan"), device=device),
            torch.zeros((), dtype=torch.long, device=device))


def _oldest_first(window: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    size = window.shape[0]
    return window.index_select(0, (pos + torch.arange(size, device=window.device)) % size)


def level_of(window: torch.Tensor, pos: torch.Tensor, config: GuardSettings) -> torch.Tensor:
    """The norm's current level ``judge`` compares with (not its log): the median norm of
    the last ``config.level`` taken steps (NaN while the window is empty)."""
    ordered = _oldest_first(window, pos)
    return torch.exp(torch.nanmedian(ordered[ordered.shape[0] - config.level:]))


def judge(window: torch.Tensor, pos: torch.Tensor, norm: torch.Tensor, config: GuardSettings,
          scaler_inf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Whether to skip the step whose global gradient norm is ``norm`` (a 0-d tensor), and
    its code (0 taken, 1 ``nonfinite_grad``, 2 ``grad_norm_outlier``, 3 ``loss_scale``: the
    GradScaler's ``scaler_inf`` overflow, whatever the norm says); a taken step's log-norm
    enters ``window`` at ``pos``, both updated in place. All on the norm's device, no sync.

    The norm's level is the median log-norm of the last ``config.level`` taken steps, its
    noise the robust spread of the step-to-step changes over the window (1.4826 x their
    MAD / sqrt 2, at least ``config.floor``): a trend (a norm falling 100x early in
    training) moves the level, not the noise, and a skip means "k times the run's own
    step-to-step noise above where it is now" (``GuardSettings`` reasons the numbers).

        >>> config = GuardSettings(min_history=4, window=8, level=4)
        >>> window, pos = new_window(config)
        >>> codes = [int(judge(window, pos, torch.tensor(v), config)[1])
        ...          for v in (1.0, 1.1, 0.9, 1.0, 4.0, 6.0, float("nan"))]
        >>> codes   # 4x the level is inside the band, 6x is not, NaN never is
        [0, 0, 0, 0, 0, 2, 1]
    """
    # A with block, not the decorator: mutmut (bench/mutation.py) mutates no decorated
    # function, and this is the decision its score is to measure.
    with torch.no_grad():
        ordered = _oldest_first(window, pos)
        level = torch.nanmedian(ordered[ordered.shape[0] - config.level:])
        steps = ordered[1:] - ordered[:-1]  # NaN where either slot is still empty
        spread = torch.nanmedian((steps - torch.nanmedian(steps)).abs())
        sigma = torch.clamp(_MAD_TO_SIGMA / math.sqrt(2.0) * spread, min=config.floor)
        count = (~torch.isnan(window)).sum()
        nonfinite = ~torch.isfinite(norm)
        log_norm = torch.log(torch.clamp(norm, min=_TINY))
        outlier = (count >= config.min_history) & (log_norm > level + config.k * sigma)
        skip = nonfinite | outlier
        code = torch.where(nonfinite, 1, torch.where(outlier, 2, 0)).to(torch.float32)
        if scaler_inf is not None:  # the scaler's overflow is the reason, whatever ours says
            scaled = scaler_inf.to(norm.device) > 0
            code = torch.where(scaled, torch.full_like(code, 3.0), code)
            skip = skip | scaled
        # Only a taken step's log-norm enters the window: rewrite the slot with itself otherwise.
        # Not a zero norm's either: half of ``level`` steps of all-zero gradients (a masked
        # stretch of data) made the level log(1e-30), and every later step an outlier.
        enters = ~skip & (norm > 0)
        slot = pos.view(1)
        kept = torch.where(enters, log_norm.view(1), window.index_select(0, slot))
        window.index_copy_(0, slot, kept)
        pos.copy_((pos + enters.long()) % config.window)
        return skip, code


def skip_reason(code: float | None) -> str | None:
    """The reason a decoded code names (None: the step was taken)."""
    if code is None or code != code:
        return None
    index = int(code)
    return SKIP_REASONS[index] if 0 <= index < len(SKIP_REASONS) else None


class StepGuard:
    """Skips a bad optimizer step on device; see the module docstring."""

    def __init__(self, stats: Any, optimizer: torch.optim.Optimizer,
                 config: GuardSettings) -> None:
        self.stats = stats
        self.optimizer = optimizer
        self.config = config
        self.fused = bool(getattr(optimizer, "_step_supports_amp_scaling", False)) and (
            "grad_scaler" not in inspect.signature(optimizer.step).parameters)
        self._window: torch.Tensor | None = None
        self._pos: torch.Tensor | None = None
        self._code: torch.Tensor | None = None
        self._had_found_inf = False
        self._scaler_found_inf: Any = None
        self._held: list[tuple[torch.Tensor, torch.Tensor | None]] = []
        self._stepped_once = False  # the optimizer has taken a step: its state exists
        self._flag_set = False
        self._hooks = Hooks()

    @property
    def syncs(self) -> bool:
        """Whether deciding costs a host sync per step (a non-fused optimizer on CUDA)."""
        params = self.stats.params
        return not self.fused and bool(params) and params[0].device.type == "cuda"

    def attach(self) -> StepGuard:
        """Hook the optimizer; call after ``GradStats.attach`` (its pre-hook measures first)."""
        self._hooks.around_step(self.optimizer, self.before_step, self.after_step)
        return self

    def detach(self) -> None:
        self._hooks.remove()

    def add_to(self, pack: Any) -> None:
        """Put this step's decision into its ``StatsPack`` (read with its one host copy)."""
        if self._code is not None:
            pack.add("skip_code", self._code)
            self._code = None

    def before_step(self) -> None:
        with torch.no_grad():  # not the decorator: see judge
            norm = getattr(self.stats, "last_grad_norm", None)
            if norm is None:
                return  # no gradient at all: nothing to judge
            opt = self.optimizer
            scale = getattr(opt, "grad_scale", None)  # a fused step under GradScaler: scaled
            norm = norm.float() if scale is None else norm.float() / scale.to(norm.device)
            scaler_inf = getattr(opt, "found_inf", None)
            skip, code = self._decide(norm, scaler_inf)
            self._code = code
            if self.fused and self._stepped_once:
                self._had_found_inf = hasattr(opt, "found_inf")
                self._scaler_found_inf = scaler_inf
                flag = skip.float()
                if scaler_inf is not None:
                    flag = (flag + scaler_inf.to(flag.device)).clamp(max=1.0)
                opt.found_inf = flag  # type: ignore[attr-defined]
                self._flag_set = True
            elif bool(skip):  # non-fused: one host read (free on CPU, a sync on CUDA)
                self._held = [(p, p.grad) for p in self.stats.params]
                for p, _ in self._held:
                    p.grad = None
            else:
                self._stepped_once = True

    def after_step(self) -> None:
        opt = self.optimizer
        if self._flag_set:  # put back what was there: the GradScaler's flag, or nothing
            if self._had_found_inf:
                opt.found_inf = self._scaler_found_inf  # type: ignore[attr-defined]
            elif hasattr(opt, "found_inf"):
                del opt.found_inf
            self._scaler_found_inf, self._flag_set = None, False
        for p, grad in self._held:
            p.grad = grad
        self._held = []

    def _decide(self, norm: torch.Tensor,
                scaler_inf: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        if self._window is None or self._window.device != norm.device:
            self._window, self._pos = new_window(self.config, norm.device)
        assert self._pos is not None
        return judge(self._window, self._pos, norm, self.config, scaler_inf)
