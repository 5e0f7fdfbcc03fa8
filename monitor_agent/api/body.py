"""The request-body layer of the routes that take records (ingest, preview, the peer
door): a body read under its budgets, inflated, split and parsed, and a whole request
refused with ``BadRequest`` (status and a reason naming what is wrong).

Budgets that protect the whole request (body, inflated body, JSON values, records) are
checked before parsing; an NDJSON line that does not parse or is too long costs only
itself (an ``Unparsed`` in its place, rejected alone by record_batch.py).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import Request

from monitor_agent.errors import MonitorAgentError
from monitor_agent.records import wire

RETRY_AFTER_S = 5
"""Seconds a 409, 429 or 503 answer asks the sender to wait (``Retry-After``)."""
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")

BODY_ERRORS: dict[int | str, dict[str, str]] = {
    400: {"description": "Malformed body"},
    401: {"description": "Missing or wrong bearer token"},
    413: {"description": "Body, inflated body or batch too large"},
    415: {"description": "Unsupported content type or encoding"},
    422: {"description": "Every record was invalid"},
}
"""How any route that reads a batch of records (ingest, preview) refuses a body."""


class BadRequest(MonitorAgentError):
    """A request refused as a whole: ``status`` and a ``reason`` naming what is wrong."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status, self.reason = status, reason


async def read_limited(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BadRequest(413, f"body of {declared} bytes exceeds max_body_bytes={limit}")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BadRequest(413, f"body exceeds max_body_bytes={limit}")
        chunks.append(chunk)
    return b"".join(chunks)


class Line:
    """A parsed NDJSON line and its bytes (stored as they are when verbatim_ok)."""

    __slots__ = ("obj", "raw")

    def __init__(self, obj: Any, raw: bytes) -> None:
        self.obj, self.raw = obj, raw


class Unparsed:
    """An NDJSON line that is not a record; rejected on its own, its neighbours kept."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def decode(body: bytes, headers: Any, settings: Any) -> list[Any]:
    """The request's records (an ``Unparsed`` for each NDJSON line that is not one)."""
    encoding = headers.get("content-encoding", "identity").strip().lower()
    chunks: Iterator[bytes]
    if encoding == "gzip":
        chunks = gunzip(body, settings.max_decompressed_bytes)
    elif encoding in ("", "identity"):
        chunks = iter((body,))
    else:
        raise BadRequest(415, f"unsupported Content-Encoding {encoding!r}; use gzip or none")
    ctype = headers.get("content-type", "application/json").split(";")[0].strip().lower()
    if ctype in NDJSON_TYPES:
        return _ndjson(chunks, settings)
    if ctype not in ("application/json", ""):
        raise BadRequest(
            415, f"unsupported Content-Type {ctype!r}; use application/json or application/x-ndjson"
        )
    whole = b"".join(chunks)
    check_values(count_values(whole), settings.max_values_per_request)
    objs = _json_batch(whole)
    del whole
    check_records(len(objs), settings.max_records_per_request)
    return objs


def check_records(count: int, limit: int) -> None:
    if count > limit:
        raise BadRequest(413, f"more than {limit} records (max_records_per_request={limit}); "
                              "split the batch")


def count_values(data: bytes) -> int:
    """About how many JSON values parsing ``data`` would build, counted on the bytes: the
    values in each array or object are one more than the commas between them, so commas
    plus containers opened is at least the count (commas or brackets inside strings only
    make it larger). Counting the containers is what catches ``[{},{},...]``: half a
    million empty objects in 1.5 kB of gzip are as many values as their commas say again,
    and each costs more than a number once built."""
    return data.count(b",") + data.count(b"{") + data.count(b"[")


def check_values(values: int, limit: int) -> None:
    """Bound the objects that parsing would build, before building them (``_values``;
    nesting without commas is cut by the parser's depth limit). A few passes over the
    bytes; 1 MiB of dense numbers is ~40 MiB of Python objects."""
    if values > limit:
        raise BadRequest(413, f"body holds about {values} JSON values, more than "
                          f"max_values_per_request={limit}; split the batch")


INFLATE_CHUNK = 1 << 20
"""Bytes inflated at a time: a gzip body is never held inflated whole, only as lines."""


def gunzip(body: bytes, limit: int) -> Iterator[bytes]:
    """The inflated body, a chunk at a time, stopping with a 413 past ``limit`` bytes.

    Every member of a multi-member body is read (RFC 1952: a file may be several members,
    and ``gzip.decompress`` reads them all), under one ``limit`` for them together; trailing
    zero padding is tolerated, as gzip(1) tolerates it, and anything else after a member
    must be another member (400)."""
    data, size = body, 0
    while True:
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        while not inflater.eof:
            try:
                out = inflater.decompress(data, INFLATE_CHUNK)
            except zlib.error as exc:
                raise BadRequest(400, f"body is not valid gzip: {exc}") from None
            data = inflater.unconsumed_tail
            if not out and not data:
                break
            size += len(out)
            if size > limit:
                raise BadRequest(413, f"inflated body exceeds max_decompressed_bytes={limit}")
            yield out
        if not inflater.eof:
            raise BadRequest(400, "gzip body is truncated")
        data = inflater.unused_data
        if not data.strip(b"\0"):
            return


def _split_lines(chunks: Iterable[bytes], max_line: int) -> Iterator[bytes | int]:
    """Each line of a stream of chunks, as bytes; a line longer than ``max_line`` comes as
    its length instead, and its bytes are never gathered (only counted as they pass)."""
    tail, skipping = b"", -1  # the line so far; or the length of an over-long one
    for chunk in chunks:
        pos = 0
        while True:
            nl = chunk.find(b"\n", pos)
            end = len(chunk) if nl < 0 else nl
            if skipping < 0 and len(tail) + end - pos > max_line:
                tail, skipping = b"", len(tail)  # never joined: it is only counted
            if skipping >= 0:
                skipping += end - pos
            else:
                tail = tail + chunk[pos:end] if tail else chunk[pos:end]
            if nl < 0:
                break
            yield skipping if skipping >= 0 else tail
            tail, skipping, pos = b"", -1, nl + 1
    if skipping >= 0 or tail:
        yield skipping if skipping >= 0 else tail


def parse_json(data: bytes, what: str) -> Any:
    try:
        return wire.loads(data)
    except UnicodeDecodeError as exc:
        raise BadRequest(400, f"{what} is not valid JSON: not UTF-8 text (byte {exc.start}: "
                              f"{exc.reason})") from None
    except (ValueError, RecursionError) as exc:
        detail = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise BadRequest(400, f"{what} is not valid JSON: {detail}") from None


def _json_batch(body: bytes) -> list[Any]:
    obj = parse_json(body, "body")
    if isinstance(obj, dict) and isinstance(obj.get("records"), list):
        return obj["records"]
    if isinstance(obj, list):
        return obj
    raise BadRequest(400, 'body must be {"records": [...]} or a JSON array of records')


def _ndjson(chunks: Iterable[bytes], settings: Any) -> list[Any]:
    """Each line's object, paired with the line itself (``Line``), or why it is not one.

    Lines are counted against ``max_records_per_request`` and their values against
    ``max_values_per_request`` as they are split off the (inflating) stream, before any is
    parsed: a body of millions of tiny lines (``{}``, no commas) stops at the budget having
    built at most that many, and nothing of it is held once the 413 is answered."""
    objs: list[Any] = []
    try:
        _ndjson_into(objs, chunks, settings)
    except BadRequest:
        # The lines parsed so far go now, not when the last reference to the exception's
        # traceback (which holds this frame) does.
        objs.clear()
        raise
    return objs


def _ndjson_into(objs: list[Any], chunks: Iterable[bytes], settings: Any) -> None:
    max_record, max_records = settings.max_record_bytes, settings.max_records_per_request
    max_values = settings.max_values_per_request
    # ``values`` counts the lines' values exactly; ``uncounted`` holds the lines not counted
    # yet, whose lengths (``bound``) bound their values (a value costs at least a byte), so
    # a body far under the budget is never counted byte by byte. Where the bound could pass
    # the budget the count is made exact first: the 413 comes on the same line, with the
    # same number, as when every line was counted.
    values, bound = 0, 0
    uncounted: list[bytes] = []
    for lineno, line in enumerate(_split_lines(chunks, max_record), 1):
        if isinstance(line, bytes):
            line = line.strip()
            if not line:
                continue
        if len(objs) >= max_records:
            check_records(max_records + 1, max_records)
        if isinstance(line, int):
            objs.append(Unparsed(f"line {lineno}: {line} bytes exceed "
                                  f"max_record_bytes={max_record}"))
            continue
        if values + bound + len(line) <= max_values:
            bound += len(line)
            uncounted.append(line)
        else:
            values += sum(map(count_values, uncounted)) + count_values(line)
            bound, uncounted = 0, []
            check_values(values, max_values)
        try:
            objs.append(Line(parse_json(line, f"line {lineno}"), line))
        except BadRequest as exc:
            objs.append(Unparsed(exc.reason))
