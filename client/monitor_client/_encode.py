"""JSON encoding of records with docs/format.md's number rules, using only the standard library.

Non-finite floats are the signal the monitor exists to catch, so they are written as the
strings "NaN", "Infinity" and "-Infinity" (never null, never dropped). Values json cannot
encode (numpy scalars, tensors, paths, user objects in a config) degrade to a number or a
string instead of raising into training.

A NaN loss, an infinite gradient norm and a path in a config, on the wire::

    >>> from pathlib import PurePosixPath
    >>> dumps_line({"step": 3, "loss": float("nan"), "grad_norm": float("inf"),
    ...             "config": {"spool_dir": PurePosixPath("/scratch/spool")}})
    b'{"step":3,"loss":"NaN","grad_norm":"Infinity","config":{"spool_dir":"/scratch/spool"}}'
"""

from __future__ import annotations

import json
import math
from typing import Any


def _nonfinite(x: float) -> str:
    return "NaN" if x != x else ("Infinity" if x > 0 else "-Infinity")


def to_wire(obj: Any) -> Any:
    """Copy ``obj`` with non-finite floats replaced by docs/format.md's strings."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else _nonfinite(obj)
    if isinstance(obj, dict):
        return {str(k): to_wire(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [to_wire(v) for v in obj]
    if obj is None or isinstance(obj, str | int | bool):
        return obj
    return to_wire(_fallback(obj))


def _fallback(obj: Any) -> Any:
    # numpy scalars and 0-d tensors have .item(); anything else becomes its str().
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            value = item()
            if isinstance(value, int | float | bool):
                return value
        except (TypeError, ValueError, RuntimeError):
            pass
    tolist = getattr(obj, "tolist", None)
    if callable(tolist):
        try:
            return tolist()
        except (TypeError, ValueError, RuntimeError):
            pass
    return str(obj)


def dumps_line(record: dict[str, Any]) -> bytes:
    """One record as compact JSON bytes (no newline).

    Most records hold only JSON's own types and finite numbers: those are encoded as they
    are, by the C encoder, without the copy ``to_wire`` makes (half the sender thread's
    work per step before). One that does not (a NaN, a tensor, a path) raises there and
    takes the copy."""
    try:
        return json.dumps(record, separators=(",", ":"), allow_nan=False).encode()
    except (ValueError, TypeError):
        return json.dumps(to_wire(record), separators=(",", ":"), allow_nan=False).encode()
