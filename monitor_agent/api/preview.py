"""``POST /v1/records/preview``: a NaN/Inf step sent ahead of its backlog, to page now.

A client that cannot deliver (the sidecar was away) keeps records in its spool and replays
them oldest first; the detectors only look forward, so that order must hold, and a page
about a NaN step would wait for the whole backlog. Instead the client sends a copy of the
alarming step here first, and the record itself stays in its place in the stream.

The body, the token and every limit are those of ``POST /v1/records`` (same 401, 413, 415,
422). The nan_inf rule is applied to each step (``Engine.preview``) and its finding starts
an alert at once (for a run the sidecar has stored: a made-up run id begins nothing, and
the answer's ``unknown_run`` names such steps, which a client whose run record waits in
the same backlog sends again once that record is delivered, so that the page names the
first NaN step rather than one previewed after the run was stored);
nothing is stored, no detector state changes, no finding row is written:
the in-order copy, when it arrives, is stored and judged as usual and its finding folds
into the same alert, so there is one page.

A body of ``{"records": [{"kind": "step", "run_id": "r", "step": 9, "time": 1.0, "loss":
"NaN"}]}`` is answered 200 ``{"received": 1, "alerts": 1, "rejected": [], "unknown_run":
[]}`` (``alerts`` is 0 when that alert fires already; ``unknown_run`` is ``[0]`` when the
sidecar has no record of run ``r``). monitor_client's sender posts these for the alarming steps
it has to spool (client/monitor_client/_alarming.py); tests/api/test_preview.py posts them
over real HTTP.
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from monitor_agent.api.body import BODY_ERRORS, BadRequest
from monitor_agent.api.deps import require_write, services
from monitor_agent.api.heap import release_freed_memory
from monitor_agent.api.record_batch import (
    Rejection,
    read_records,
    reason_label,
    sorted_rejections,
)
from monitor_agent.storage.database import StorageError

router = APIRouter(tags=["ingest"])


class PreviewResponse(BaseModel):
    received: int = Field(description="Valid records in the request (none is stored).")
    alerts: int = Field(description="Alerts this preview began (0 when already firing).")
    rejected: list[Rejection] = Field(default_factory=list)
    unknown_run: list[int] = Field(
        default_factory=list,
        description="Indexes of the steps whose run this sidecar has no record of yet: they "
                    "began nothing. Send them again once the run's first records (its run "
                    "record) were delivered, so its page names the step they are about.")


@router.post(
    "/v1/records/preview",
    response_model=PreviewResponse,
    dependencies=[Depends(require_write)],
    summary="Page now about a NaN/Inf step that waits behind a client's backlog; stores nothing",
    responses={**BODY_ERRORS, 503: {"description": "Cannot page right now; retry later"}},
)
async def post_preview(request: Request) -> PreviewResponse:
    state = services(request)
    try:
        valid, rejected = await read_records(request)
        done = await state.runner.call(state.engine.preview, valid, time.time())
    except BadRequest as exc:
        status, reason = exc.status, exc.reason  # not the exception: it holds the body
    except StorageError as exc:
        status, reason = 503, f"cannot record the alert right now ({exc}); retry later"
    else:
        return PreviewResponse(received=len(valid), alerts=done.begun,
                               rejected=sorted_rejections(rejected),
                               unknown_run=done.unknown_run)
    state.metrics.rejections.labels(reason=reason_label(status)).inc()
    if status == 413:
        await run_in_threadpool(release_freed_memory)
    raise HTTPException(status, reason)
