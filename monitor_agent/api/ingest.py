"""``POST /v1/records``: a batch of records, JSON or NDJSON, optionally gzip.

Every record is validated on its own, so one bad record (a schema error, a line that does
not parse, a line over ``max_record_bytes``) costs only itself and the answer says why;
nothing is acknowledged before the transaction holding it committed. Budgets that protect
the whole request (body, inflated body, JSON values, records) are checked before parsing.
"""

from __future__ import annotations

import logging
import time
import zlib
from collections.abc import Iterable, Iterator
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, Field, TypeAdapter

from monitor_agent.api.deps import require_write, services
from monitor_agent.api.heap import release_freed_memory
from monitor_agent.api.verbatim import verbatim_ok
from monitor_agent.errors import MonitorAgentError
from monitor_agent.pipeline.attempts import AttemptWaits
from monitor_agent.pipeline.engine import Incoming
from monitor_agent.records import schemas, wire
from monitor_agent.storage.database import StorageError

log = logging.getLogger(__name__)
router = APIRouter(tags=["ingest"])

RETRY_AFTER_S = 5
NDJSON_TYPES = ("application/x-ndjson", "application/jsonl", "application/json-lines")


class Rejection(BaseModel):
    index: int = Field(description="Position of the record in the batch (0-based).")
    reason: str = Field(description="What is wrong, naming the field.")


class IngestAttemptOut(BaseModel):
    """The attempt of a run id that a batch's records went to (pipeline/attempts.py)."""

    run_id: str
    token: str = Field(description="The records' ``attempt`` token ('' when they had none).")
    number: int = Field(description="1 for the run's first attempt, then 2, 3, ...")
    kind: str = Field(description="first, resumed, restarted, or pending (no step yet).")
    start_step: int | None = Field(description="The attempt's first step.")
    superseded_from: int | None = Field(
        description="First step of the earlier history it replaced (kept as abandoned).")
    superseded_to: int | None = Field(description="Last step of that range.")


class IngestResponse(BaseModel):
    accepted: int = Field(description="Records stored now.")
    duplicates: int = Field(description="Records already stored (a retry); not counted twice.")
    late: int = Field(default=0, description="Stored, but older than the run's latest step.")
    rejected: list[Rejection] = Field(default_factory=list)
    actions: list[dict[str, Any]] = Field(
        default_factory=list, description="Actions the trainer should take: those this "
        "batch made a rule take (stop, checkpoint, rollback) and the run's open ones not yet "
        "honoured (a pending rollback, a stop), whichever rank's records decided them; "
        "each has an id, so a client keeps each once."
    )
    attempts: list[IngestAttemptOut] = Field(
        default_factory=list,
        description="Per run id and token of the batch: the attempt its records went to.")


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


@router.post(
    "/v1/records",
    response_model=IngestResponse,
    dependencies=[Depends(require_write)],
    summary="Ingest a batch of records (JSON {records: [...]} or NDJSON; gzip accepted)",
    responses={**BODY_ERRORS, 409: {"description": (
        "A new process of a run whose current job still sends (pipeline/attempts.py): "
        "retry later")}, 429: {"description": "Too many active runs"},
               503: {"description": "Cannot store right now; retry later"}},
)
async def post_records(request: Request) -> Response:
    state = services(request)
    t0 = time.perf_counter()
    code = "200"
    try:
        response, code = await _ingest(request)
        # The model's own JSON, serialised here: handed the model, FastAPI would validate
        # it against response_model again first, on the event loop, for every batch.
        return Response(response.model_dump_json(), media_type="application/json")
    except BadRequest as exc:
        # Keep only status and reason: the exception's traceback holds the frames, and so
        # the (inflated) body, for as long as anything references the exception.
        status, reason = exc.status, exc.reason
        code = str(status)
    finally:
        state.metrics.requests.labels(code=code).inc()
        state.metrics.ingest_duration.observe(time.perf_counter() - t0)
    if status == 413:
        await run_in_threadpool(release_freed_memory)
    state.metrics.rejections.labels(reason=reason_label(status)).inc()
    # 409, 429 and 503 are "later": say when, so clients and proxies back off alike.
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status in (409, 429, 503) else None
    raise HTTPException(status, reason, headers=headers)


async def read_records(request: Request) -> tuple[list[Incoming], list[dict[str, Any]]]:
    """A request's valid records and the rejections of the others, under every ingest
    budget (body, inflated body, values, records, record size); raises BadRequest for what
    refuses the whole request (not ready, too large, malformed, every record invalid)."""
    state = services(request)
    settings = state.settings
    if not state.readiness.ready:
        raise BadRequest(503, f"not ready: {state.readiness.why_not}; retry later")
    body = await read_limited(request, settings.max_body_bytes)
    # One worker thread hop for both (a hop costs the event loop about what validating
    # a small record does).
    valid, rejected = await run_in_threadpool(_decode_and_validate, body, request.headers,
                                              settings)
    del body
    state.metrics.records.labels(outcome="rejected").inc(len(rejected))
    if rejected:
        state.metrics.rejections.labels(reason="invalid").inc(len(rejected))
    if rejected and not valid:
        raise BadRequest(422, summary(rejected))
    return valid, rejected


def _decode_and_validate(body: bytes, headers: Any, settings: Any
                         ) -> tuple[list[Incoming], list[dict[str, Any]]]:
    objs = _decode(body, headers, settings)
    del body
    return validate_records(objs, settings.max_record_bytes, arrival=time.time())


async def _ingest(request: Request) -> tuple[Any, str]:
    state = services(request)
    valid, rejected = await read_records(request)
    if not valid:
        return IngestResponse(accepted=0, duplicates=0), "200"
    try:
        peer = request.client.host if request.client is not None else None
        # The run's own lane: another run's requests queued at once wait for one of its
        # calls at most, not all of them (pipeline/runner.py).
        result = await state.runner.call(state.engine.ingest, valid, time.time(), peer,
                                         lane=valid[0].record.run_id)
    except StorageError as exc:
        state.readiness.failed(exc)
        raise BadRequest(503, f"cannot store records right now ({exc}); retry later") from None
    except AttemptWaits as exc:  # a new process while the run's job still sends: later
        raise BadRequest(409, exc.reason) from None
    rejected.extend(result.rejected)
    response = IngestResponse(
        accepted=result.accepted, duplicates=result.duplicates, late=result.late,
        rejected=sorted_rejections(rejected), actions=result.actions,
        attempts=[IngestAttemptOut(token=token, **view)
                  for (_, token), view in result.attempts.items()],
    )
    if len(result.rejected) == len(valid):
        crowded = all("max_active_runs" in r["reason"] for r in result.rejected)
        raise BadRequest(429 if crowded else 422, summary(rejected))
    return response, "200"


def sorted_rejections(rejected: list[dict[str, Any]]) -> list[Rejection]:
    """The answer's rejections, in batch order."""
    return [Rejection(index=r["index"], reason=r["reason"])
            for r in sorted(rejected, key=lambda r: r["index"])]


def summary(rejected: list[dict[str, Any]]) -> str:
    first = rejected[0]
    more = f" (and {len(rejected) - 1} more)" if len(rejected) > 1 else ""
    return f"no record accepted: record {first['index']}: {first['reason']}{more}"


def reason_label(status: int) -> str:
    return {401: "auth", 409: "attempt_waits", 413: "too_large", 422: "invalid",
            429: "too_many_runs", 503: "unavailable"}.get(status, "body")


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


class _Line:
    """A parsed NDJSON line and its bytes (stored as they are when verbatim_ok)."""

    __slots__ = ("obj", "raw")

    def __init__(self, obj: Any, raw: bytes) -> None:
        self.obj, self.raw = obj, raw


class _Unparsed:
    """An NDJSON line that is not a record; rejected on its own, its neighbours kept."""

    def __init__(self, reason: str) -> None:
        self.reason = reason


def _decode(body: bytes, headers: Any, settings: Any) -> list[Any]:
    """The request's records (an ``_Unparsed`` for each NDJSON line that is not one)."""
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
    _check_records(len(objs), settings.max_records_per_request)
    return objs


def _check_records(count: int, limit: int) -> None:
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
    """Each line's object, paired with the line itself (``_Line``), or why it is not one.

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
    values = 0
    for lineno, line in enumerate(_split_lines(chunks, max_record), 1):
        if isinstance(line, bytes):
            line = line.strip()
            if not line:
                continue
        if len(objs) >= max_records:
            _check_records(max_records + 1, max_records)
        if isinstance(line, int):
            objs.append(_Unparsed(f"line {lineno}: {line} bytes exceed "
                                  f"max_record_bytes={max_record}"))
            continue
        values += count_values(line)
        check_values(values, settings.max_values_per_request)
        try:
            objs.append(_Line(parse_json(line, f"line {lineno}"), line))
        except BadRequest as exc:
            objs.append(_Unparsed(exc.reason))


def validate_records(
    objs: list[Any], max_record_bytes: int, arrival: float | None = None,
) -> tuple[list[Incoming], list[dict[str, Any]]]:
    """Validate each record and choose the bytes to store: the client's line when it holds
    only fields docs/format.md defines (verbatim.py), else the record re-serialised.
    ``arrival``: the sidecar's clock now; a record's ``time`` may be ahead of it only by
    ``limits.MAX_CLOCK_AHEAD_SECONDS`` (both doors: ingest and the peer door)."""
    valid, rejected = [], []
    for index, obj in enumerate(objs):
        try:
            if isinstance(obj, _Unparsed):
                raise schemas.RecordError(obj.reason)
            raw = None
            if isinstance(obj, _Line):
                obj, raw = obj.obj, obj.raw
            model = schemas.validate(obj)
            if arrival is not None:
                schemas.check_arrival(model, arrival)
            if raw is not None and verbatim_ok(obj, raw):
                body = raw
            else:
                body = model.model_dump_json(exclude_none=True).encode()
            if len(body) > max_record_bytes:
                raise schemas.RecordError(f"record of {len(body)} bytes exceeds "
                                          f"max_record_bytes={max_record_bytes}")
            valid.append(Incoming(index, schemas.to_record(model), body))
        except schemas.RecordError as exc:
            rejected.append({"index": index, "reason": str(exc)})
        except Exception as exc:
            # A value validation let through that a consumer still cannot take is our bug,
            # and it costs this record only: its neighbours are judged on their own.
            log.exception("record %d of a batch could not be validated", index)
            rejected.append({"index": index, "reason": "record could not be validated "
                             f"({type(exc).__name__}); the sidecar's log has the details"})
        objs[index] = None  # free the parsed objects as we go: peak memory is one copy
    return valid, rejected


def install_openapi(app: FastAPI) -> None:
    """Describe the raw-body ingest endpoints in OpenAPI (FastAPI cannot infer it)."""
    adapter = TypeAdapter(list[schemas.RecordModel])

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes,
                          summary=app.summary)
        items = adapter.json_schema(ref_template="#/components/schemas/{model}")
        defs = items.pop("$defs", {})
        doc.setdefault("components", {}).setdefault("schemas", {}).update(defs)
        envelope = {"type": "object", "required": ["records"], "properties": {"records": items}}
        for path in ("/v1/records", "/v1/records/preview"):  # the same bodies
            if path in doc["paths"]:
                doc["paths"][path]["post"]["requestBody"] = {
                    "required": True,
                    "content": {
                        "application/json": {"schema": envelope},
                        "application/x-ndjson": {"schema": {"type": "string"}},
                    },
                }
        app.openapi_schema = doc
        return doc

    app.openapi = openapi  # type: ignore[method-assign]
