"""Typed request dependencies: the app's services, and the optional bearer token.

This is the one module that reads ``request.app.state``; handlers declare what they need::

    @router.get("/v1/runs", response_model=RunsListOut)
    async def list_runs(queries: QueriesDep, runner: RunnerDep) -> dict[str, Any]:
        return {"runs": [asdict(r) for r in await runner.call(queries.run_listings)]}

The dependencies are ``async def``: they only look things up, and FastAPI would run a plain
``def`` one in a worker thread for every request.
"""

from __future__ import annotations

import hmac
from pathlib import Path
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.concurrency import run_in_threadpool

from monitor_agent.alerting import Alerting
from monitor_agent.api.services import Services
from monitor_agent.api.streamed_page import ReadSlots
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.reads.exposition import Exposition
from monitor_agent.reads.queries import RunQueries
from monitor_agent.settings import TokenError


def services(request: Request) -> Services:
    """The app's services (set by serving/app.py's lifespan before the first request)."""
    found: Services = request.app.state.services
    return found


async def _services(request: Request) -> Services:
    return services(request)


async def _runner(request: Request) -> EngineRunner:
    return services(request).runner


async def _metrics(request: Request) -> SelfMetrics:
    return services(request).metrics


async def _queries(request: Request) -> RunQueries:
    return services(request).queries


async def _alerting(request: Request) -> Alerting:
    return services(request).alerting


async def _exposition(request: Request) -> Exposition:
    return services(request).exposition


async def _read_slots(request: Request) -> ReadSlots:
    return services(request).read_slots


async def _history_db(request: Request) -> Path:
    return services(request).history_db


ServicesDep = Annotated[Services, Depends(_services)]
RunnerDep = Annotated[EngineRunner, Depends(_runner)]
MetricsDep = Annotated[SelfMetrics, Depends(_metrics)]
QueriesDep = Annotated[RunQueries, Depends(_queries)]
"""Call its methods only through ``RunnerDep``: live run state belongs to the engine thread."""
AlertingDep = Annotated[Alerting, Depends(_alerting)]
"""Its calls touch SQLite: from a sync handler or ``run_in_threadpool``, not the loop."""
ExpositionDep = Annotated[Exposition, Depends(_exposition)]
ReadSlotsDep = Annotated[ReadSlots, Depends(_read_slots)]
"""Take one for an answer that may be large (api/streamed_page.py's ``streamed``)."""
HistoryDep = Annotated[Path, Depends(_history_db)]
"""The path of the charts' history database."""


async def require_write(request: Request) -> None:
    """Reject writes and admin calls without the configured bearer token (if one is set).

    ``token_file`` is read each time, so a rotated token applies at once; file reads do
    not belong on the event loop, so with a token file the check runs in a worker thread.
    A token from the settings (or none) is checked right here: a worker thread per request
    for a comparison cost a run leader hearing 128 nodes a thread hop per POST. A token
    file deleted, emptied or unreadable at runtime fails closed: 503 with the reason
    (clients retry), logged once per outage, never open and never a 500.
    """
    if services(request).settings.token_file is not None:
        await run_in_threadpool(check_write, request)
    else:
        check_write(request)


async def require_peer(request: Request) -> None:
    """The leader link's own credential (``cluster.peer_token``, or the one derived from
    the write token: ``Settings.peer_token_value``), not the write token: a job holding
    the write token is no node sidecar, and a host that receives the link's credential
    never learns the write token. Fails closed like ``require_write``."""
    settings = services(request).settings
    if settings.token_file is not None or settings.cluster.peer_token_file is not None:
        await run_in_threadpool(check_write, request, True)
    else:
        check_write(request, True)


def check_write(request: Request, peer: bool = False) -> None:
    """``require_write``'s check (it may read the token file: not on the event loop);
    ``peer``: ``require_peer``'s."""
    found = services(request)
    try:
        token = found.settings.peer_token_value() if peer else found.settings.token_value()
    except TokenError as exc:
        # Fail closed: a token that cannot be read now guards everything it guarded.
        found.token_health.unavailable(str(exc))
        raise HTTPException(
            status_code=503, detail=f"bearer token unavailable ({exc}); guarded routes are "
            "refused until it is fixed", headers={"Retry-After": "5"}) from None
    found.token_health.available()
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken must not reveal how much of the token matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        why = "wrong bearer token" if given and scheme.lower() == "bearer" else (
            "no bearer token")
        found.rejections.rejected(request, why)
        what = ("the leader link's credential (cluster.peer_token; the write token is not "
                "it)" if peer else "<token>")
        raise HTTPException(
            status_code=401,
            detail=f"missing or invalid bearer token (send 'Authorization: Bearer {what}')",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_read(request: Request) -> None:
    """Reads are open unless ``auth_reads`` is set; then they need the token too (a plain
    ``def``: FastAPI runs it in a worker thread, where the token file may be read)."""
    if services(request).settings.auth_reads:
        check_write(request)
