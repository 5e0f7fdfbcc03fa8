"""JSON with docs/format.md's number rules, and trace-file reading.

Non-finite floats are the signal this product exists to catch, so they must survive a
round trip: we write them as the strings "NaN", "Infinity", "-Infinity" and read both those
strings (the wire models convert them) and the bare tokens Python's ``json`` writes.

A NaN and an infinity written as strings and read back (the wire models do what
``nonfinite_to_float`` does here), and the bare token Python's ``json`` writes::

    >>> blob = dumps({"loss": float("nan"), "grad_norm": float("-inf"), "step": 3})
    >>> blob
    b'{"loss":"NaN","grad_norm":"-Infinity","step":3}'
    >>> [nonfinite_to_float(v) for v in loads(blob).values()], loads(b'{"loss": NaN}')
    ([nan, -inf, 3], {'loss': nan})

``iter_trace(path)`` yields the JSON objects of a JSON Lines trace file, gzip or plain, one
per non-blank line, and raises ``TraceError`` naming the file and line of a bad one
(tests/records/test_wire.py).
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from monitor_agent.records import RecordError

_NONFINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def loads(data: bytes | str) -> Any:
    """Parse JSON; orjson for speed, the stdlib only when bare NaN/Infinity tokens occur."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth" in str(exc) or "recursion" in str(exc):
            # No record is that deep; the stdlib would only recurse into a RecursionError.
            raise ValueError(f"nested too deeply ({exc})") from None
        # orjson rejects the bare tokens that docs/format.md says readers must accept.
        return json.loads(data, parse_constant=_NONFINITE.__getitem__)


def _encode_nonfinite(obj: Any) -> Any:
    if isinstance(obj, float):
        if math.isfinite(obj):
            return obj
        return "NaN" if obj != obj else ("Infinity" if obj > 0 else "-Infinity")
    if isinstance(obj, dict):
        return {k: _encode_nonfinite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        if all_finite_numbers(obj):
            return obj  # a detector snapshot is mostly windows of numbers: one C pass each
        return [_encode_nonfinite(v) for v in obj]
    return obj


def all_finite_numbers(seq: list[Any] | tuple[Any, ...]) -> bool:
    """Whether ``seq`` holds only numbers, all finite: their sum is then finite (a NaN or
    an infinity makes it non-finite; a sum too large to be finite only sends the list the
    slow way); anything else than a number makes ``sum`` raise."""
    try:
        return math.isfinite(sum(seq))
    except (TypeError, OverflowError):
        return False


def encode_nonfinite(obj: Any) -> Any:
    """``obj`` with every non-finite float (in it, or in its dicts and lists) written as
    docs/format.md's string: what ``dumps`` writes, ready for ``dumps_prepared``."""
    return _encode_nonfinite(obj)


def dumps(obj: Any) -> bytes:
    """Serialise to JSON bytes, writing non-finite floats as docs/format.md's strings."""
    # orjson would silently write NaN as null, losing exactly the data we care about.
    return dumps_prepared(_encode_nonfinite(obj))


def dumps_prepared(encoded: Any) -> bytes:
    """``dumps`` of an object whose non-finite floats are strings already
    (``encode_nonfinite``, or a detector snapshot: ``detectors.support.state.dump``
    writes them so): no second walk over every value of a large snapshot."""
    try:
        return orjson.dumps(encoded, option=orjson.OPT_SERIALIZE_NUMPY)
    except orjson.JSONEncodeError:
        # A string UTF-8 cannot carry (a lone surrogate, stored by an older version): the
        # answer shows U+FFFD there instead of failing for the whole run.
        return orjson.dumps(_scrub(encoded), option=orjson.OPT_SERIALIZE_NUMPY)


def _scrub(obj: Any) -> Any:
    if isinstance(obj, str):
        return obj.encode("utf-8", "replace").decode("utf-8")
    if isinstance(obj, dict):
        return {_scrub(k): _scrub(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_scrub(v) for v in obj]
    return obj


# A JSON string (skipped as it is), or a bare non-finite token outside any string (group 1).
_STRING_OR_NONFINITE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|(-?Infinity|NaN)')


def stored_to_wire(body: bytes) -> bytes:
    """A stored JSON line as an answer carries it: each bare ``NaN``/``Infinity`` token
    (Python's ``json`` writes them, and a line stored verbatim may hold them) becomes
    docs/format.md's string; everything else is left byte for byte.

    Not ``dumps(loads(body))``: parsed, a 4 MiB record of floats takes about ten times its
    size in Python objects, and a read answer must stay within a small bound per chunk;
    this costs the output's bytes. A token inside a string is text and stays::

        >>> stored_to_wire(b'{"loss": NaN, "note": "NaN, -Infinity", "g": -Infinity}')
        b'{"loss": "NaN", "note": "NaN, -Infinity", "g": "-Infinity"}'
        >>> stored_to_wire(b'{"loss": 2.5}')
        b'{"loss": 2.5}'
    """
    if b"NaN" not in body and b"Infinity" not in body:
        return body
    return _STRING_OR_NONFINITE.sub(_quote_nonfinite, body)


def _quote_nonfinite(match: re.Match[bytes]) -> bytes:
    token = match.group(1)
    return match.group(0) if token is None else b'"' + token + b'"'


def nonfinite_to_float(value: Any) -> Any:
    """Turn one of docs/format.md's non-finite strings back into a float; pass anything else."""
    if isinstance(value, str):
        return _NONFINITE.get(value, value)
    return value


def open_trace(path: str | Path):
    """Open a trace file for reading bytes, gzip or plain, judged by its magic number."""
    path = Path(path)
    with path.open("rb") as fh:
        magic = fh.read(2)
    if magic == b"\x1f\x8b":
        return gzip.open(path, "rb")
    return path.open("rb")


class TraceError(RecordError):
    """A trace file that cannot be read; the message starts ``file:line[:column]:``."""


def iter_trace(path: str | Path) -> Iterator[dict[str, Any]]:
    """Yield the JSON objects of a JSON Lines trace, skipping blank lines."""
    lineno = 0
    with open_trace(path) as fh:
        lines = iter(fh)
        while True:
            try:
                line = next(lines, None)
            except (OSError, EOFError, zlib.error) as exc:  # a corrupt or truncated gzip
                raise TraceError(f"{path}:{lineno + 1}: cannot read: {exc}") from None
            if line is None:
                return
            lineno += 1
            line = line.strip()
            if not line:
                continue
            try:
                obj = loads(line)
            except ValueError as exc:
                column = f":{exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
                reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
                raise TraceError(f"{path}:{lineno}{column}: not valid JSON: {reason}") from None
            if not isinstance(obj, dict):
                raise TraceError(f"{path}:{lineno}: expected a JSON object per line")
            yield obj
