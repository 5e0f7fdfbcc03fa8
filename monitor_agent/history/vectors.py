"""How the chart history stores a per-layer vector: dense, or sparse when mostly empty.

A step's vector has a slot for every name the run has charted so far, NaN where the step
said nothing. A client that names a few layers a step (or a new one every step) would
make each stored vector as wide as every name seen, and the history grow with the square
of the names, from records of a few bytes. So a vector whose slots are mostly NaN is stored
as the positions and values of the others: what is stored is never more than twice the
numbers the record carried (8 bytes each: a uint32 position and a float32), and never
more than the dense form.

The sparse form starts with a NaN whose payload no number that reaches the history can
have: JSON has no NaN payloads, and every NaN the fold makes is numpy's or Python's
canonical one (0x7fc00000). Both forms read back as the same dense vector::

    >>> nan = float("nan")
    >>> dense = np.array([1.0, 2.0, nan], np.float32)
    >>> len(encode(dense)), decode(encode(dense)).tolist()[:2]
    (12, [1.0, 2.0])
    >>> sparse = np.full(1000, nan, np.float32); sparse[998] = 5.0
    >>> len(encode(sparse)), len(decode(encode(sparse))), float(decode(encode(sparse))[998])
    (16, 1000, 5.0)
"""

from __future__ import annotations

import numpy as np

_MARK = np.array([0x7FA50FF5], dtype="<u4").tobytes()  # a signalling NaN, see above


def encode(vec: np.ndarray) -> bytes:
    """A float32 vector's stored form: sparse when fewer than half its slots hold a value."""
    vec = np.asarray(vec, dtype="<f4").ravel()
    where = np.flatnonzero(~np.isnan(vec))
    if 2 * len(where) >= len(vec):
        return vec.tobytes()
    head = np.array([len(vec)], dtype="<u4").tobytes()
    return _MARK + head + where.astype("<u4").tobytes() + vec[where].tobytes()


def decode(blob: bytes) -> np.ndarray:
    """The dense float32 vector of a stored blob (either form)."""
    if len(blob) < 8 or blob[:4] != _MARK:
        return np.frombuffer(blob, dtype="<f4")
    width = int(np.frombuffer(blob, dtype="<u4", count=1, offset=4)[0])
    n = (len(blob) - 8) // 8
    where = np.frombuffer(blob, dtype="<u4", count=n, offset=8)
    out = np.full(width, np.nan, dtype=np.float32)
    out[where] = np.frombuffer(blob, dtype="<f4", count=n, offset=8 + 4 * n)
    return out
