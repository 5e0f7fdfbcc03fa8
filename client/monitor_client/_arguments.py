"""How the arguments of ``Monitor(...)``, ``watch(...)`` and the framework callbacks become
a ``MonitorSettings`` / ``WatchSettings`` (``settings.py``, where each knob is defined and checked).

A keyword fills the field of its name (``config``: ``hparams``) where ``settings`` leave the
default; one that contradicts a value the settings chose is a ``TypeError``. The old
spellings (the keywords that moved into the configs, a config object passed as ``config=``)
are applied the same way, with a ``DeprecationWarning`` naming the new spelling, until the
next release.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from typing import Any

from monitor_client.settings import MonitorSettings, WatchSettings

# The keywords that Monitor(...) and watch(...) no longer take, until the next release:
# each fills the config field of its name (Monitor's layer_stats_every and hist_every: the
# fields of its WatchSettings, MonitorSettings.watch).
LEGACY_MONITOR_KEYWORDS = ("rank", "world_size", "rank0_only", "layer_stats_every",
                           "hist_every", "spool_dir", "spool_max_bytes", "spool_max_age",
                           "max_queue", "linger", "timeout", "close_timeout", "gpu_probe",
                           "install_hooks", "enabled")
LEGACY_WATCH_KEYWORDS = ("apply_clip", "seq_len", "flops_per_token", "peak_flops",
                         "compute_dtype", "layer_stats_every", "hist_every", "pre_hook",
                         "snapshot_budget_bytes", "sharded", "activations", "activation_every",
                         "max_activation_modules", "finite_flags")
_FOR_WATCH = ("layer_stats_every", "hist_every")  # Monitor's legacy keywords for .watch
# Warnings point at the caller of Monitor(...)/watch(...): this module, then that method.
_CALLER = 3


def monitor_settings(where: str, config: MonitorSettings | Mapping[str, Any] | None,
                     settings: MonitorSettings | None, keywords: dict[str, Any],
                     legacy: dict[str, Any]) -> MonitorSettings:
    """The ``MonitorSettings`` for the arguments of ``Monitor(...)`` (or of a callback that
    makes one): ``settings`` with ``config`` (the hyperparameters) and ``keywords`` (the
    other arguments, by their field names) filled in.

    ``legacy`` are the keywords ``where`` no longer takes (``LEGACY_MONITOR_KEYWORDS``):
    applied the same way, with a ``DeprecationWarning``, as is a config object passed as
    ``config``. Any other name is a ``TypeError``, as for any function.
    """
    if isinstance(config, MonitorSettings):
        if settings is not None:
            raise TypeError(f"{where}(): got a MonitorSettings as both config= and settings=")
        warnings.warn(f"{where}(config=MonitorSettings(...)) is deprecated and will be removed "
                      f"in the next release: pass it as {where}(settings=MonitorSettings(...)); "
                      "config= is the run's hyperparameters", DeprecationWarning,
                      stacklevel=_CALLER)
        settings, config = config, None
    if settings is None:
        settings = MonitorSettings()
    elif not isinstance(settings, MonitorSettings):
        raise TypeError(f"{where}(settings=...) takes a MonitorSettings, not "
                        f"{type(settings).__name__}")
    legacy = _take_legacy(where, legacy, LEGACY_MONITOR_KEYWORDS, "MonitorSettings")
    keywords = {**keywords, **{k: v for k, v in legacy.items() if k not in _FOR_WATCH}}
    if config is not None:
        keywords["hparams"] = dict(config)  # a copy: the caller's dict is left alone
    watch = _merge(settings.watch, {k: v for k, v in legacy.items() if k in _FOR_WATCH},
                   where)
    merged = _merge(settings, keywords, where)
    return merged if watch is merged.watch else dataclasses.replace(merged, watch=watch)


def watch_settings(base: WatchSettings, settings: WatchSettings | None,
                   keywords: dict[str, Any], legacy: dict[str, Any]) -> WatchSettings:
    """The ``WatchSettings`` for the arguments of ``watch(...)``.

    ``settings`` when given, with the keywords filled in (as ``monitor_settings`` does);
    else ``base`` (the Monitor's) with every keyword that is not at its default applied.
    ``legacy``: the keywords ``watch`` no longer takes (``LEGACY_WATCH_KEYWORDS``) and
    ``config`` (now ``settings``), each with a ``DeprecationWarning``.
    """
    if "config" in legacy:
        old = legacy.pop("config")
        if settings is not None:
            raise TypeError("watch(): got both config= and settings=")
        warnings.warn("watch(config=WatchSettings(...)) is deprecated and will be removed in "
                      "the next release: pass it as watch(settings=WatchSettings(...))",
                      DeprecationWarning, stacklevel=_CALLER)
        settings = old
    keywords = {**keywords, **_take_legacy("watch", legacy, LEGACY_WATCH_KEYWORDS,
                                           "WatchSettings")}
    # watch(layer_stats_every=None or 0) and watch(hist_every=None) meant "the Monitor's".
    keywords = {k: v for k, v in keywords.items()
                if not (k in _FOR_WATCH and v is None)
                and not (k == "layer_stats_every" and v == 0)}
    if settings is not None:
        if not isinstance(settings, WatchSettings):
            raise TypeError(f"watch(settings=...) takes a WatchSettings, not "
                            f"{type(settings).__name__}")
        return _merge(settings, keywords, "watch")
    return dataclasses.replace(base, **_changed(WatchSettings, keywords))


def _take_legacy(where: str, legacy: dict[str, Any], known: tuple[str, ...],
                 config: str) -> dict[str, Any]:
    """Refuse unknown keywords; warn once for the deprecated ones, naming the new spelling."""
    unknown = sorted(set(legacy) - set(known))
    if unknown:
        raise TypeError(f"{where}() got an unexpected keyword argument {unknown[0]!r}")
    if legacy:
        given = ", ".join(f"{k}=..." for k in legacy)
        own = [f"{k}=..." for k in legacy if not (config == "MonitorSettings" and k in _FOR_WATCH)]
        inner = [f"{k}=..." for k in legacy if config == "MonitorSettings" and k in _FOR_WATCH]
        if inner:
            own.append(f"watch=WatchSettings({', '.join(inner)})")
        warnings.warn(f"{where}({given}) is deprecated and will be removed in the next "
                      f"release: pass settings={config}({', '.join(own)})",
                      DeprecationWarning, stacklevel=_CALLER + 1)
    return legacy


def _merge(config: Any, keywords: dict[str, Any], where: str) -> Any:
    """``config`` with the keywords that are not at their default filled in; one that
    contradicts a value the config chose (not its default) is a ``TypeError``."""
    defaults = _defaults(type(config))
    chosen = {k: v for k, v in _changed(type(config), keywords).items()
              if not _same(v, getattr(config, k))}
    clashes = [f"{k}={v!r} (settings has {getattr(config, k)!r})" for k, v in chosen.items()
               if not _same(getattr(config, k), defaults[k])]
    if clashes:
        raise TypeError(f"{where}(): got settings={type(config).__name__}(...) and keywords "
                        f"that contradict it: {', '.join(clashes)}; pass one or the other, "
                        "or dataclasses.replace(settings, ...)")
    return dataclasses.replace(config, **chosen) if chosen else config


def _changed(cls: type, keywords: dict[str, Any]) -> dict[str, Any]:
    """The keywords whose value is not the field's default: those the caller chose."""
    defaults = _defaults(cls)
    return {k: v for k, v in keywords.items() if not _same(v, defaults[k])}


def _defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls)}


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - values without a plain truth value (arrays) differ
        return False
