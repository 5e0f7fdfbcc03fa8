"""``POST /v1/records``: a batch of records, JSON or NDJSON, optionally gzip.

The body is read under its budgets (body.py) and each record validated on its own
(record_batch.py); nothing is acknowledged before the transaction holding it committed.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Request, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from monitor_agent.api.body import BODY_ERRORS, RETRY_AFTER_S, BadRequest
from monitor_agent.api.deps import require_write, services
from monitor_agent.api.heap import release_freed_memory
from monitor_agent.api.models import ActionWire
from monitor_agent.api.record_batch import (
    Rejection,
    read_records,
    reason_label,
    sorted_rejections,
    summary,
)
from monitor_agent.pipeline.attempts import AttemptWaits
from monitor_agent.storage.database import StorageError

router = APIRouter(tags=["ingest"])


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
    actions: list[ActionWire] = Field(
        default_factory=list, description="Actions the trainer should take: those this "
        "batch made a rule take (stop, checkpoint, rollback) and the run's open ones not yet "
        "honoured (a pending rollback, a stop), whichever rank's records decided them; "
        "each has an id, so a client keeps each once."
    )
    attempts: list[IngestAttemptOut] = Field(
        default_factory=list,
        description="Per run id and token of the batch: the attempt its records went to.")


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
