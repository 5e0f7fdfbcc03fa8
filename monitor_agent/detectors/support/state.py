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
import math
from typing import Any

import numpy as np

from monitor_agent.records import wire
from monitor_agent.records.wire import nonfinite_to_float

_FIELDS: dict[type, tuple[str, ...]] = {}  # a dataclass's field names: a snapshot dumps thousands
_AS_THEY_ARE = (int, str, bool, type(None))


def dump(obj: Any) -> Any:
    """JSON-able data of a dataclass (and of the dicts, lists and numpy values in it), its
    non-finite floats written as ``wire.dumps`` writes them, so that a snapshot of a
    thousand ranks is serialised with ``wire.dumps_prepared``, without a second walk."""
    kind = type(obj)
    if kind is float:
        return obj if math.isfinite(obj) else wire.encode_nonfinite(obj)
    if kind in _AS_THEY_ARE:
        return obj
    names = _FIELDS.get(kind)
    if names is None and dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = _FIELDS[kind] = tuple(f.name for f in dataclasses.fields(obj))
    if names is not None:
        return {name: dump(getattr(obj, name)) for name in names}
    if isinstance(obj, np.ndarray):
        values = obj.tolist()
        if obj.dtype.kind == "f" and obj.ndim == 1:
            for i in np.flatnonzero(~np.isfinite(obj)).tolist():  # a window's empty slots
                values[i] = wire.encode_nonfinite(values[i])
        elif obj.dtype.kind == "f" and not np.isfinite(obj).all():
            return wire.encode_nonfinite(values)
        return values
    if isinstance(obj, dict):
        return {str(k): dump(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [dump(v) for v in obj]
    if isinstance(obj, np.generic):
        return dump(obj.item())
    return obj


def plain(value: Any) -> Any:
    """JSON data back to Python values, non-finite strings back to floats."""
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        if wire.all_finite_numbers(value):
            return value  # a window of numbers: one C pass, not one call a value
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
        setattr(obj, f.name, _array(value, current.dtype)
                if isinstance(current, np.ndarray) else plain(value))
    return obj


def _array(value: Any, dtype: np.dtype[Any]) -> np.ndarray:
    """A dumped array back: numpy reads the non-finite strings itself ("NaN",
    "-Infinity"), at C speed; anything else goes value by value."""
    try:
        return np.array(value, dtype=dtype)
    except (TypeError, ValueError):
        return np.array(plain(value), dtype=dtype)
