"""How the arguments of ``Monitor(...)``, ``watch(...)`` and the framework callbacks become
a ``MonitorSettings`` / ``WatchSettings`` (``settings.py``, where each knob is defined and
checked), and the run's hyperparameters (``config=``) a dict of its own.

A keyword fills the field of its name where ``settings`` leave the default; one that
contradicts a value the settings chose is a ``TypeError``: two spellings of one knob must
not disagree in silence.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from monitor_client._errors import SettingsTypeError
from monitor_client.settings import MonitorSettings, WatchSettings


def hyperparameters(where: str, config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's hyperparameters as given to ``where(config=...)``: a copy, so the caller's
    dict is left alone (the Monitor adds ``total_steps`` and the watch settings to it)."""
    if config is None:
        return {}
    if not isinstance(config, Mapping):
        raise SettingsTypeError(f"{where}(config=...) is the run's hyperparameters, a dict, not "
                        f"{type(config).__name__}")
    return dict(config)


def monitor_settings(where: str, settings: MonitorSettings | None,
                     keywords: dict[str, Any]) -> MonitorSettings:
    """The ``MonitorSettings`` for the arguments of ``Monitor(...)`` (or of a callback that
    makes one): ``settings`` with ``keywords`` (the other arguments, by their field names)
    filled in."""
    if settings is None:
        settings = MonitorSettings()
    elif not isinstance(settings, MonitorSettings):
        raise SettingsTypeError(f"{where}(settings=...) takes a MonitorSettings, not "
                        f"{type(settings).__name__}")
    return _merge(settings, keywords, where)


def watch_settings(base: WatchSettings, settings: WatchSettings | None,
                   keywords: dict[str, Any]) -> WatchSettings:
    """The ``WatchSettings`` for the arguments of ``watch(...)``: ``settings`` when given,
    with the keywords filled in (as ``monitor_settings`` does); else ``base`` (the
    Monitor's) with every keyword that is not at its default applied.

        >>> watch_settings(WatchSettings(hist_every=0), None, {"grad_clip": 1.0})
        WatchSettings(grad_clip=1.0, ..., hist_every=0, ...)
    """
    if settings is None:
        return dataclasses.replace(base, **_changed(WatchSettings, keywords))
    if not isinstance(settings, WatchSettings):
        raise SettingsTypeError(f"watch(settings=...) takes a WatchSettings, not "
                        f"{type(settings).__name__}")
    return _merge(settings, keywords, "watch")


def _merge(settings: Any, keywords: dict[str, Any], where: str) -> Any:
    """``settings`` with the keywords that are not at their default filled in; one that
    contradicts a value the settings chose (not its default) is a ``TypeError``."""
    defaults = _defaults(type(settings))
    chosen = {k: v for k, v in _changed(type(settings), keywords).items()
              if not _same(v, getattr(settings, k))}
    clashes = [f"{k}={v!r} (settings has {getattr(settings, k)!r})" for k, v in chosen.items()
               if not _same(getattr(settings, k), defaults[k])]
    if clashes:
        raise SettingsTypeError(f"{where}(): got settings={type(settings).__name__}(...) and keywords "
                        f"that contradict it: {', '.join(clashes)}; pass one or the other, "
                        "or dataclasses.replace(settings, ...)")
    return dataclasses.replace(settings, **chosen) if chosen else settings


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
