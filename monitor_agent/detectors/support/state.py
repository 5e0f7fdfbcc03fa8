"""Snapshot and restore of detector state: dataclass fields to JSON-able data and back.

``wire.dumps`` writes NaN/inf as strings, so restoring turns those strings back into
floats. Restore is driven by the live object's field types: a numpy field comes back as
an array of the same dtype, a nested dataclass is filled in place.

A window with two of its three slots filled (the empty one is NaN), through the wire
format and back into a fresh window::

    >>> from monitor_agent.detectors.support.stats import Window
    >>> from monitor_agent.records import wire
    >>> win = Window.of(3)
    >>> win.add(0.5); win.add(0.7)
    >>> blob = wire.dumps(dump(win))
    >>> blob
    b'{"buf":[0.5,0.7,"NaN"],"n":2,"i":2}'
    >>> back = load_into(Window.of(3), wire.loads(blob))
    >>> back.values().tolist(), back.buf.dtype.name, back.full
    ([0.5, 0.7], 'float64', False)
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from monitor_agent.records.wire import nonfinite_to_float


def dump(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: dump(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, dict):
        return {str(k): dump(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [dump(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def plain(value: Any) -> Any:
    """JSON data back to Python values, non-finite strings back to floats."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return nonfinite_to_float(value)


def load_into(obj: Any, data: dict[str, Any]) -> Any:
    """Fill dataclass ``obj`` from ``data`` (as made by ``dump``); return ``obj``."""
    for f in dataclasses.fields(obj):
        if f.name not in data:
            continue
        current, value = getattr(obj, f.name), data[f.name]
        if dataclasses.is_dataclass(current):
            load_into(current, value)
            continue
        if isinstance(current, np.ndarray):
            value = np.array(plain(value), dtype=current.dtype)
        else:
            value = plain(value)
        setattr(obj, f.name, value)
    return obj
