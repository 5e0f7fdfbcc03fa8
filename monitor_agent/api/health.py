"""Liveness, readiness and the Prometheus exposition.

``GET /healthz`` answers 200 ``{"status": "ok"}`` while the process serves HTTP;
``GET /readyz`` answers 200 ``{"status": "ready"}`` when records can be stored and every
part works (no database corrupt, every background thread alive and working), else 503
``{"status": "not ready", "reason": ...}``, every problem joined by "; " (``Readiness`` in
api/readiness.py); ``GET /metrics`` is the Prometheus text exposition: it names runs and
their values, so with ``auth_reads`` it needs the token like every other read (Prometheus
sends it with ``authorization: {credentials_file: ...}`` in its scrape config).
tests/api/test_health.py asks them over real HTTP (and has promtool check the exposition).
"""

from __future__ import annotations

import time

from fastapi import APIRouter, Depends, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from monitor_agent.api.deps import ExpositionDep, MetricsDep, ServicesDep, require_read
from monitor_agent.api.models import HealthOut, ReadyOut
from monitor_agent.reads.exposition import CONTENT_TYPE

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=HealthOut, summary="Liveness: the process serves HTTP")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz", response_model=ReadyOut,
            summary="Readiness: records can be stored now and every part works (503 with the "
                    "reasons if not)",
            responses={503: {"model": ReadyOut, "description": "Not ready, and why"}})
async def readyz(services: ServicesDep) -> JSONResponse:
    problems = services.readiness.problems()
    if not problems:
        return JSONResponse({"status": "ready"})
    return JSONResponse({"status": "not ready", "reason": "; ".join(problems)},
                        status_code=503)


@router.get("/metrics", summary="Prometheus text exposition", response_class=Response,
            dependencies=[Depends(require_read)],
            responses={200: {"description": "The text exposition format, version 0.0.4",
                             "content": {CONTENT_TYPE: {"schema": {"type": "string"}}}}})
async def metrics(exposition: ExpositionDep, self_metrics: MetricsDep) -> Response:
    t0 = time.perf_counter()
    # Rendering is CPU work; off the event loop so ingest requests keep flowing.
    body = await run_in_threadpool(exposition.render)
    self_metrics.render_duration.observe(time.perf_counter() - t0)
    return Response(content=body, media_type=CONTENT_TYPE)
