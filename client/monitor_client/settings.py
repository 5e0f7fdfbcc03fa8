"""``MonitorSettings`` and ``WatchSettings``: the client's knobs, each defined and checked here.

``Monitor(...)`` and ``Monitor.watch(...)`` take only what nearly every script sets (where
to report, as which run, with which hyperparameters; the clipping threshold); every other
knob is a field of one of these two frozen dataclasses, documented with its unit below and
passed as ``settings=``. A settings object rejects a nonsensical value when it is built,
naming the field; it compares by value, and ``dataclasses.replace`` makes a variant.

A script passes them as ``Monitor(project="gpt", config={"lr": 3e-4}, settings=settings)``;
``mon.watch(model, optimizer, grad_clip=1.0)`` then measures what ``settings.watch`` says,
clipping at 1.0. Building, refusing nonsense, and a variant::

    >>> import dataclasses
    >>> settings = MonitorSettings(spool_dir="/scratch/spool", linger=0.2,
    ...                            watch=WatchSettings(layer_stats_every=10, activations=True))
    >>> settings.watch.layer_stats_every, settings.max_queue
    (10, 10000)
    >>> WatchSettings(hist_every=-1)
    Traceback (most recent call last):
    monitor_client._errors.SettingsValueError: WatchSettings.hist_every must be a finite
    number >= 0, not -1
    >>> quick = dataclasses.replace(settings, linger=0.0)    # settings itself is unchanged
    >>> quick.linger, settings.linger, quick == dataclasses.replace(settings, linger=0.0)
    (0.0, 0.2, True)

A keyword argument fills the field of the same name; given together with ``settings``, it
may fill a field the settings leave at its default or repeat their value, but one that
contradicts a value the settings chose is a ``TypeError``. Each refusal is a
``MonitorClientError`` too (``_errors.py``). The run's hyperparameters are not a setting:
they are ``Monitor(config={...})``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from monitor_client._errors import SettingsTypeError, SettingsValueError

# Per-layer statistics cost ~10 passes over the parameters (bench/client_overhead.py);
# every 25 steps keeps that under 1% of a typical step, and under 0.5% amortised.
DEFAULT_LAYER_STATS_EVERY = 25
# Gradient/weight distributions come from a fixed 1024-element sample per parameter, so
# their cost does not grow with the model (bench/client_overhead.py); every 50 steps is far
# below 1% of a step. 0 turns them off.
DEFAULT_HIST_EVERY = 50
# What close() (and so the end of the script) may wait for an unresponsive sidecar: long
# enough for a healthy one to take the last batch, short enough not to be noticed.
DEFAULT_CLOSE_TIMEOUT = 2.0
# Where the sidecar listens when neither MonitorSettings.url nor MONITOR_AGENT_URL says.
DEFAULT_URL = "http://127.0.0.1:9400"

__all__ = ["DEFAULT_CLOSE_TIMEOUT", "DEFAULT_HIST_EVERY", "DEFAULT_LAYER_STATS_EVERY",
           "DEFAULT_URL", "GuardSettings", "MonitorSettings", "WatchSettings"]


@dataclass(frozen=True)
class GuardSettings:
    """The step guard's numbers (``watch(..., guard=True)`` takes these defaults; what the
    guard does is in ``_guard.py``).

    A step is skipped when its global pre-clip gradient norm is non-finite, or when its
    natural log is more than ``k * sigma`` above the norm's level: the median log-norm of
    the last ``level`` taken steps, ``sigma`` the robust spread of the step-to-step changes
    of the last ``window`` taken log-norms (1.4826 x MAD / sqrt 2, at least ``floor``);
    nothing is judged an outlier before ``min_history`` norms are in the window.

    Why the logarithm: a gradient norm's noise is multiplicative (a batch twice as hard
    doubles it, and a run whose norm is 10 wanders ten times as far as one at 1), so its
    spread is a spread of ratios; the recorded healthy runs (144 runs, 61,267 steps in
    ``tests/traces``) differ 30-fold in it. Why step-to-step changes and a short level: the
    norm drifts (it falls 100x in the first hundred steps of a fresh run), and a spread
    measured around the window's median counts that drift as noise: a corrupt batch 14,000x
    the norm at step 130 of such a run sat inside that band. The changes from one step to
    the next carry the noise without the trend, and the median of the last 16 steps follows
    the trend. (The band this replaced, 6 sigma of the norm itself around the window's
    median, skipped 459 of every 10,000 healthy steps.)

    Fields, with units and why:
        k: noise sigmas above the level (default 10). Healthy tails are far heavier than
            normal: a skip loses a batch of training, so the guard is judged on precision,
            and at 10 (with the floor below) it skips 2 of the 61,267 recorded healthy
            steps, 0.33 per 10,000, under the 1 per 10,000 it is held to, and none of its
            own healthy runs' (``python -m bench.guard_precision`` prints both); at 8 it
            skips 8 of them (1.3 per 10,000), at 6 it skips 51.
        window: taken steps whose step-to-step changes make the noise estimate (default
            128, as OLMo-core): long enough that the MAD is steady (its relative standard
            error is about 1.1/sqrt(n), ~10% at 128), short enough to follow a change of
            regime (warmup, LR decay).
        min_history: norms in the window before any outlier judgement (default 64): the
            MAD of fewer has a relative error above ~15%, so "10 sigma" could really be 8.
            Non-finite gradients are skipped from the first step.
        level: taken steps whose median log-norm is the norm's current level (default 16):
            the median of 16 ignores up to 7 odd steps, and 16 steps is short against the
            hundreds over which a norm drifts.
        floor: the least sigma, in natural-log units (default 0.15, i.e. ~15% relative
            noise): a norm that barely moves from step to step (a clipped or saturated
            run, a smooth schedule) would otherwise make a 1.2x step "10 sigma"; with 0.15
            nothing below exp(10 x 0.15) = 4.5x the level is ever skipped. The single bad
            batches that corrupt training are well beyond that (labels x1000: ~1000x; the
            recorded random-label batches of a GPT: 5.5-7x); milder ones are the
            loss-spike detector's to report, not a reason to drop data.

        >>> GuardSettings().k, GuardSettings().window, GuardSettings().level, GuardSettings().floor
        (10.0, 128, 16, 0.15)
        >>> GuardSettings(min_history=200)
        Traceback (most recent call last):
        monitor_client._errors.SettingsValueError: GuardSettings.min_history must be between 1
        and window=128, not 200
    """

    k: float = 10.0
    window: int = 128
    min_history: int = 64
    level: int = 16
    floor: float = 0.15

    def __post_init__(self) -> None:
        _positive(self, "k")
        _whole(self, "window")
        _whole(self, "min_history")
        if self.min_history > self.window:
            raise SettingsValueError(f"GuardSettings.min_history must be between 1 and window="
                             f"{self.window}, not {self.min_history}")
        _whole(self, "level")
        if self.level > self.window:
            raise SettingsValueError(f"GuardSettings.level must be between 1 and window="
                             f"{self.window}, not {self.level}")
        _at_least(self, "floor", 0)


@dataclass(frozen=True)
class WatchSettings:
    """What ``Monitor.watch`` measures, and how (see its docstring for each effect).

    Fields, with units:
        grad_clip: max global gradient L2 norm, applied in the optimizer pre-hook from the
            norm measured anyway; None or 0: no clipping (the norm is still measured). 0
            means off because that is how scripts spell it (nanoGPT's ``grad_clip = 0.0``
            "disables"), so it is stored as None.
        apply_clip: False records ``grad_clip`` as the threshold without clipping.
        seq_len: tokens per sample, for the FLOPs estimate (None: from the model).
        flops_per_token: model FLOPs per token (None: estimated from the model).
        peak_flops: the device's peak FLOP/s for MFU (None: from a table of devices).
        compute_dtype: the dtype the model computes in (None: the parameters').
        layer_stats_every: per-layer statistics every N optimizer steps (>= 1).
        hist_every: gradient/weight distributions every N steps; 0: never.
        pre_hook: False for closure-based steps (Lightning), which call
            ``before_optimizer_step()`` themselves.
        snapshot_budget_bytes: cap on the parameter copy for update norms, in bytes
            (None: one whole copy).
        sharded: FSDP/ZeRO: all-reduce the global norms.
        activations: False, True (default modules), module types, or a
            ``(name, module) -> bool`` filter.
        activation_every: activation statistics every N steps (None: ``layer_stats_every``).
        max_activation_modules: at most this many modules hooked (None: 64).
        finite_flags: name the module where a forward NaN appeared: ``"sampled"``
            (default; True means it) sums each row's first 32 bytes of each repeated
            block's (``ModuleList`` element's) and outside leaf's output, ``"full"`` every
            element of every leaf module's, False none (``_finite.py``).
        guard: skip an optimizer step whose gradient is non-finite or an outlier
            (``GuardSettings``; True: its defaults; None or False: off). Needs ``pre_hook``.
    """

    grad_clip: float | None = None
    apply_clip: bool = True
    seq_len: int | None = None
    flops_per_token: float | None = None
    peak_flops: float | None = None
    compute_dtype: Any = None
    layer_stats_every: int = DEFAULT_LAYER_STATS_EVERY
    hist_every: int = DEFAULT_HIST_EVERY
    pre_hook: bool = True
    snapshot_budget_bytes: int | None = None
    sharded: bool = False
    activations: Any = False
    activation_every: int | None = None
    max_activation_modules: int | None = None
    finite_flags: bool | str = "sampled"
    guard: GuardSettings | None = None

    def __post_init__(self) -> None:
        if self.finite_flags is True:
            object.__setattr__(self, "finite_flags", "sampled")
        if self.finite_flags not in (False, None, "sampled", "full"):
            raise SettingsValueError("WatchSettings.finite_flags must be \"sampled\", \"full\", "
                                     f"True or False, not {self.finite_flags!r}")
        if self.guard is True or self.guard is False:
            object.__setattr__(self, "guard", GuardSettings() if self.guard else None)
        if self.guard is not None and not isinstance(self.guard, GuardSettings):
            raise SettingsTypeError("WatchSettings.guard must be a GuardSettings, True or None, not "
                            f"{type(self.guard).__name__}")
        if self.guard is not None and not self.pre_hook:
            raise SettingsValueError("WatchSettings.guard needs pre_hook=True: the guard decides in "
                             "the optimizer pre-hook, after the gradients are measured")
        if self.grad_clip is not None and _number(self, "grad_clip") == 0:
            object.__setattr__(self, "grad_clip", None)  # frozen; 0 spells "off"
        if self.grad_clip is not None:
            _positive(self, "grad_clip", allow_inf=True)
        _at_least(self, "layer_stats_every", 1)
        _at_least(self, "hist_every", 0)
        for name in ("seq_len", "snapshot_budget_bytes", "activation_every",
                     "max_activation_modules"):
            if getattr(self, name) is not None:
                _at_least(self, name, 1)
        for name in ("flops_per_token", "peak_flops"):
            if getattr(self, name) is not None:
                _positive(self, name)


LOSS_KINDS = frozenset({"auto", "error", "signed", "nonstationary", "rl", "td",
                        "actor_critic", "gan", "adversarial"})
"""What ``loss_kind`` may say (the sidecar's ``detectors/support/context.py`` reads it)."""


@dataclass(frozen=True)
class MonitorSettings:
    """Where a ``Monitor`` reports, as whom, and how much it may buffer.

    Fields, with units:
        url: the sidecar (None: ``MONITOR_AGENT_URL``, else http://127.0.0.1:9400).
        project: the project label.
        total_steps: optimizer steps the run will take; sent as ``config["total_steps"]``,
            from which the sidecar shows progress and an ETA (None: no ETA, unless the
            hyperparameters carry ``total_steps`` themselves).
        loss_kind: what the loss is, sent as ``config["loss_kind"]`` (None: not said, the
            sidecar judges it by its values): "error" (a non-negative loss that falls),
            "signed" (a loss of either sign that settles, a density's NLL: judged in its
            own units), "nonstationary" (also "rl", "td", "actor_critic", "gan",
            "adversarial": no stable level by design, so no level judgement - spike,
            level rise, plateau, overfitting - is made on it; a DQN's TD loss, which stays
            positive, needs it said).
        run_id: None: ``MONITOR_AGENT_RUN_ID``, ``TORCHELASTIC_RUN_ID``, ``SLURM_JOB_ID``,
            else generated (and broadcast from rank 0 under torch.distributed).
        token: bearer token (None: ``MONITOR_AGENT_TOKEN``).
        labels: extra run labels.
        rank, world_size: None: detected from the launcher's environment.
        rank0_only: only rank 0 reports.
        spool_dir: where unsent records wait (None: ``MONITOR_AGENT_SPOOL_DIR``, else the
            temp dir); spool_max_bytes (bytes) and spool_max_age (seconds, None: no limit)
            bound it.
        max_queue: records held in memory before the oldest go to the spool.
        linger: seconds the sender waits to batch records.
        timeout: HTTP (connect, read) timeouts in seconds, or one for both.
        close_timeout: seconds ``close()`` waits for the last records.
        gpu_probe: "auto" (NVML on CUDA devices), None (off), or a probe object (anything
            with ``read() -> dict | None``, ``_nvml.py``).
        gpu_sample_interval: seconds between two readings of the GPU probe, on a thread of
            its own (default 1: NVML's ECC and row-remap queries take up to milliseconds,
            and a throttle or a new ECC error matters within seconds, not within a step);
            each step record carries the latest reading.
        install_hooks: end the run on exit / uncaught exception (atexit, excepthook).
        watchdog: a thread that sends one ``hang`` record (the threads' Python stacks,
            what the process was doing) when no step completes within
            max(watchdog_floor, 5 x the median step time) (``_watchdog.py``).
        watchdog_floor: seconds; no hang is reported sooner (checkpoints, evals; default
            60, well inside the collective timeouts).
        restart_exit: leave with exit status 75 when the run's leader decides a restart
            (``_restart.py``): None, the default, when the launcher runs the process again
            on it (torchrun with restarts left, or ``MONITOR_AGENT_RESTARTS=1``:
            ``_launcher.py``); True or False to say so yourself.
        enabled: False makes every method a no-op.
        watch: what ``watch()`` measures unless told otherwise (a ``WatchSettings``).
    """

    url: str | None = None
    project: str | None = None
    total_steps: int | None = None
    loss_kind: str | None = None
    run_id: str | None = None
    token: str | None = None
    labels: Mapping[str, Any] | None = None
    rank: int | None = None
    world_size: int | None = None
    rank0_only: bool = False
    spool_dir: str | Path | None = None
    spool_max_bytes: int = 256 << 20
    spool_max_age: float | None = 7 * 86400.0
    max_queue: int = 10_000
    linger: float = 0.5
    timeout: float | tuple[float, float] = (2.0, 10.0)
    close_timeout: float = DEFAULT_CLOSE_TIMEOUT
    gpu_probe: Any = "auto"
    gpu_sample_interval: float = 1.0
    install_hooks: bool = True
    watchdog: bool = True
    watchdog_floor: float = 60.0
    restart_exit: bool | None = None
    enabled: bool = True
    watch: WatchSettings = field(default_factory=WatchSettings)

    def __post_init__(self) -> None:
        if self.labels is not None and not isinstance(self.labels, Mapping):
            raise SettingsTypeError(f"MonitorSettings.labels must be a dict, not "
                            f"{type(self.labels).__name__}")
        if not isinstance(self.watch, WatchSettings):
            raise SettingsTypeError("MonitorSettings.watch must be a WatchSettings, not "
                            f"{type(self.watch).__name__}")
        if self.total_steps is not None:
            _whole(self, "total_steps")
        if self.loss_kind is not None and self.loss_kind not in LOSS_KINDS:
            raise SettingsValueError(f"MonitorSettings.loss_kind={self.loss_kind!r} must be one of "
                             f"{', '.join(sorted(LOSS_KINDS))}")
        if self.rank is not None:
            _at_least(self, "rank", 0)
        if self.world_size is not None:
            _at_least(self, "world_size", 1)
            if self.rank is not None and self.rank >= self.world_size:
                raise SettingsValueError(f"MonitorSettings.rank={self.rank} must be below "
                                 f"world_size={self.world_size}")
        _at_least(self, "spool_max_bytes", 1)
        _at_least(self, "max_queue", 1)
        if self.spool_max_age is not None:
            _positive(self, "spool_max_age", allow_inf=True)
        _at_least(self, "linger", 0)
        _at_least(self, "close_timeout", 0)
        _positive(self, "watchdog_floor")
        if self.restart_exit is not None and not isinstance(self.restart_exit, bool):
            raise SettingsTypeError("MonitorSettings.restart_exit must be True, False or None,"
                                    f" not {self.restart_exit!r}")
        _positive(self, "gpu_sample_interval")
        _check_timeout(self.timeout)


def _number(owner: object, name: str) -> float:
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise SettingsTypeError(f"{type(owner).__name__}.{name} must be a number, not {value!r}")
    return float(value)


def _at_least(owner: object, name: str, low: float) -> None:
    value = _number(owner, name)
    if value < low or math.isinf(value):
        raise SettingsValueError(f"{type(owner).__name__}.{name} must be a finite number >= {low:g},"
                         f" not {getattr(owner, name)!r}")


def _whole(owner: object, name: str) -> None:
    _at_least(owner, name, 1)
    if _number(owner, name) != int(getattr(owner, name)):
        raise SettingsValueError(f"{type(owner).__name__}.{name} must be a whole number, not "
                         f"{getattr(owner, name)!r}")


def _positive(owner: object, name: str, allow_inf: bool = False) -> None:
    value = _number(owner, name)
    if value <= 0 or (math.isinf(value) and not allow_inf):
        raise SettingsValueError(f"{type(owner).__name__}.{name} must be > 0, not "
                         f"{getattr(owner, name)!r}")


def _check_timeout(timeout: Any) -> None:
    parts = timeout if isinstance(timeout, tuple) else (timeout,)
    ok = len(parts) in (1, 2) and all(
        isinstance(p, Real) and not isinstance(p, bool) and float(p) > 0 for p in parts)
    if not ok:
        raise SettingsValueError("MonitorSettings.timeout must be seconds > 0, or a (connect, read) "
                         f"pair of them, not {timeout!r}")
