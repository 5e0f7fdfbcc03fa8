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

from collections.abc import Sequence

import numpy as np

_WORD = 0x7FA50FF5  # a signalling NaN, see above
_MARK = np.array([_WORD], dtype="<u4").tobytes()


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


SLICE_SQL = "CASE WHEN substr(data, 1, 4) = X'F50FA57F' THEN data ELSE substr(data, ?, ?) END"
"""Columns of a stored vector in SQL: the slice of a dense blob (a vector's few slots are
read without copying out the whole of it), a sparse blob whole (its positions must be
read). Its parameters: ``1 + 4 * start`` and ``4 * (stop - start)``; ``decode_rows`` reads
what it selects."""


def decode_rows(blobs: Sequence[bytes], start: int, stop: int) -> np.ndarray:
    """Columns ``[start, stop)`` of stored vectors as selected by ``SLICE_SQL``, one row
    each, NaN where a vector is shorter. Rows of the full width in the dense form (the usual
    case) are read as one buffer, not one at a time::

        >>> sparse = np.full(6, np.nan, np.float32); sparse[3] = 7.0
        >>> decode_rows([np.array([1, 2], np.float32).tobytes(), encode(sparse),
        ...              np.array([5], np.float32).tobytes()], 2, 4).tolist()
        [[1.0, 2.0], [nan, 7.0], [5.0, nan]]
    """
    width = stop - start
    out = np.full((len(blobs), width), np.nan, dtype=np.float32)
    one_read = np.fromiter((len(blob) == 4 * width for blob in blobs), bool, count=len(blobs))
    at = np.flatnonzero(one_read)
    if len(at):
        rows = np.frombuffer(b"".join([blobs[i] for i in at.tolist()]), dtype="<f4").reshape(-1, width)
        out[at] = rows
        one_read[at[rows[:, 0].view("<u4") == _WORD]] = False  # sparse, of that very length
    for i in np.flatnonzero(~one_read).tolist():
        blob = blobs[i]
        vec = decode(blob)[start:stop] if blob[:4] == _MARK else np.frombuffer(blob, "<f4")
        out[i] = np.nan
        out[i, :min(len(vec), width)] = vec[:width]
    return out
