"""``MonitorConfig`` and ``WatchConfig``: the client's knobs as values, checked in one place.

``Monitor(...)`` and ``Monitor.watch(...)`` keep their keyword arguments; those are a thin
convenience that builds these objects. A config object is what to pass around instead: it
is frozen (``dataclasses.replace`` makes a variant), compares by value, and rejects a
nonsensical value when it is built, with the field's name in the error.

Example::

    from monitor_client import Monitor, MonitorConfig, WatchConfig

    cfg = MonitorConfig(url="http://127.0.0.1:9400", project="gpt", hparams={"lr": 3e-4},
                        watch=WatchConfig(grad_clip=1.0, layer_stats_every=10))
    mon = Monitor(config=cfg)            # same as Monitor(url=..., project=..., config={...},
    mon.watch(model, optimizer)          #   layer_stats_every=10) + watch(..., grad_clip=1.0)

Keyword arguments given together with a config object must agree with it: a keyword whose
value is neither its default nor the config's raises ``TypeError`` (a keyword left at its
default leaves the config's value alone).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

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


@dataclass(frozen=True)
class WatchConfig:
    """What ``Monitor.watch`` measures, and how (see its docstring for each effect).

    Fields, with units:
        grad_clip: max global gradient L2 norm, applied in the optimizer pre-hook from the
            norm measured anyway; None: no clipping (the norm is still measured).
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
        finite_flags: sum each leaf module's output to name where a NaN was born.
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
    finite_flags: bool = True

    def __post_init__(self) -> None:
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


@dataclass(frozen=True)
class MonitorConfig:
    """Where a ``Monitor`` reports, as whom, and how much it may buffer.

    Fields, with units:
        url: the sidecar (None: ``MONITOR_AGENT_URL``, else http://127.0.0.1:9400).
        project: the project label.
        hparams: the run's hyperparameters (JSON-able), sent once in the run record as its
            ``config``; what ``Monitor(config={...})`` has always taken.
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
        gpu_probe: "auto" (NVML on CUDA devices), None (off), or a probe object.
        install_hooks: end the run on exit / uncaught exception (atexit, excepthook).
        enabled: False makes every method a no-op.
        watch: what ``watch()`` measures unless told otherwise (a ``WatchConfig``).
    """

    url: str | None = None
    project: str | None = None
    hparams: Mapping[str, Any] | None = None
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
    install_hooks: bool = True
    enabled: bool = True
    watch: WatchConfig = field(default_factory=WatchConfig)

    def __post_init__(self) -> None:
        for name in ("hparams", "labels"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, Mapping):
                raise TypeError(f"MonitorConfig.{name} must be a dict, not "
                                f"{type(value).__name__}")
        if not isinstance(self.watch, WatchConfig):
            raise TypeError("MonitorConfig.watch must be a WatchConfig, not "
                            f"{type(self.watch).__name__}")
        if self.rank is not None:
            _at_least(self, "rank", 0)
        if self.world_size is not None:
            _at_least(self, "world_size", 1)
            if self.rank is not None and self.rank >= self.world_size:
                raise ValueError(f"MonitorConfig.rank={self.rank} must be below "
                                 f"world_size={self.world_size}")
        _at_least(self, "spool_max_bytes", 1)
        _at_least(self, "max_queue", 1)
        if self.spool_max_age is not None:
            _positive(self, "spool_max_age", allow_inf=True)
        _at_least(self, "linger", 0)
        _at_least(self, "close_timeout", 0)
        _check_timeout(self.timeout)


def monitor_config(config: MonitorConfig | Mapping[str, Any] | None,
                   keywords: dict[str, Any]) -> MonitorConfig:
    """The ``MonitorConfig`` for ``Monitor(...)``'s arguments.

    ``config`` is a MonitorConfig, or (as always) the run's hyperparameters. ``keywords``
    are the other arguments, by their MonitorConfig names; ``layer_stats_every`` and
    ``hist_every`` are the defaults of ``watch``, so they land in ``.watch``.
    """
    watch_keys = {"layer_stats_every", "hist_every"}
    own = {k: v for k, v in keywords.items() if k not in watch_keys}
    for_watch = {k: v for k, v in keywords.items() if k in watch_keys}
    if isinstance(config, MonitorConfig):
        _refuse_conflicts(config, own, "Monitor")
        _refuse_conflicts(config.watch, for_watch, "Monitor")
        return config
    hparams = None if config is None else dict(config)  # a copy, as it has always been
    return MonitorConfig(hparams=hparams, watch=WatchConfig(**for_watch), **own)


def watch_config(base: WatchConfig, config: WatchConfig | None,
                 keywords: dict[str, Any]) -> WatchConfig:
    """The ``WatchConfig`` for ``watch(...)``'s arguments.

    ``config`` when given, with keywords that merely repeat it; else ``base`` (the
    Monitor's) with every keyword that is not at its default applied.
    """
    # watch(layer_stats_every=None or 0) and watch(hist_every=None) mean "the Monitor's".
    keywords = {k: v for k, v in keywords.items()
                if not (k in ("layer_stats_every", "hist_every") and v is None)
                and not (k == "layer_stats_every" and v == 0)}
    if config is not None:
        if not isinstance(config, WatchConfig):
            raise TypeError(f"watch(config=...) takes a WatchConfig, not "
                            f"{type(config).__name__}")
        _refuse_conflicts(config, keywords, "watch")
        return config
    return dataclasses.replace(base, **_changed(WatchConfig, keywords))


def _changed(cls: type, keywords: dict[str, Any]) -> dict[str, Any]:
    """The keywords whose value is not the field's default: those the caller chose."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}
    return {k: v for k, v in keywords.items() if not _same(v, defaults[k])}


def _refuse_conflicts(config: Any, keywords: dict[str, Any], where: str) -> None:
    clashes = [f"{k}={v!r} (config has {getattr(config, k)!r})"
               for k, v in _changed(type(config), keywords).items()
               if not _same(v, getattr(config, k))]
    if clashes:
        raise TypeError(f"{where}(): got config={type(config).__name__}(...) and keywords "
                        f"that contradict it: {', '.join(clashes)}; pass one or the other, "
                        "or dataclasses.replace(config, ...)")


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain truth value (arrays) differ
        return False


def _number(owner: object, name: str) -> float:
    value = getattr(owner, name)
    if isinstance(value, bool) or not isinstance(value, Real) or math.isnan(value):
        raise TypeError(f"{type(owner).__name__}.{name} must be a number, not {value!r}")
    return float(value)


def _at_least(owner: object, name: str, low: float) -> None:
    value = _number(owner, name)
    if value < low or math.isinf(value):
        raise ValueError(f"{type(owner).__name__}.{name} must be a finite number >= {low:g},"
                         f" not {getattr(owner, name)!r}")


def _positive(owner: object, name: str, allow_inf: bool = False) -> None:
    value = _number(owner, name)
    if value <= 0 or (math.isinf(value) and not allow_inf):
        raise ValueError(f"{type(owner).__name__}.{name} must be > 0, not "
                         f"{getattr(owner, name)!r}")


def _check_timeout(timeout: Any) -> None:
    parts = timeout if isinstance(timeout, tuple) else (timeout,)
    ok = len(parts) in (1, 2) and all(
        isinstance(p, Real) and not isinstance(p, bool) and float(p) > 0 for p in parts)
    if not ok:
        raise ValueError("MonitorConfig.timeout must be seconds > 0, or a (connect, read) "
                         f"pair of them, not {timeout!r}")
