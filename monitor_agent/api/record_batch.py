"""A batch of records out of a request: each record validated on its own, so one bad
record (a schema error, a line that does not parse, a line over ``max_record_bytes``)
costs only itself and the answer says why (``Rejection``); the bytes to store chosen.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from monitor_agent.api.body import BadRequest, Line, Unparsed, decode, read_limited
from monitor_agent.api.deps import services
from monitor_agent.api.verbatim import verbatim_ok
from monitor_agent.pipeline.engine import Incoming
from monitor_agent.records import schemas

log = logging.getLogger(__name__)


class Rejection(BaseModel):
    index: int = Field(description="Position of the record in the batch (0-based).")
    reason: str = Field(description="What is wrong, naming the field.")


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
    objs = decode(body, headers, settings)
    del body
    return validate_records(objs, settings.max_record_bytes, arrival=time.time())


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
            if isinstance(obj, Unparsed):
                raise schemas.RecordError(obj.reason)
            raw = None
            if isinstance(obj, Line):
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
