"""Liveness, readiness and the Prometheus exposition."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from monitor_agent.exposition import CONTENT_TYPE

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Liveness: the process serves HTTP")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", summary="Readiness: records can be stored now (503 with the reason if not)")
async def readyz(request: Request) -> JSONResponse:
    readiness = request.app.state.readiness
    if readiness.ready:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": readiness.reason}, status_code=503)


@router.get("/metrics", summary="Prometheus text exposition", response_class=Response)
async def metrics(request: Request) -> Response:
    state = request.app.state
    t0 = time.perf_counter()
    # Rendering is CPU work; off the event loop so ingest requests keep flowing.
    body = await run_in_threadpool(state.exposition.render)
    state.metrics.render_duration.observe(time.perf_counter() - t0)
    return Response(content=body, media_type=CONTENT_TYPE)
