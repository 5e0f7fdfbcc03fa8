"""``/v1/runs``: what the sidecar knows about each run, and its stored history.

Everything about a run comes from the read side (``RunQueries``), called on the engine thread
(``runner.call``); its alerts come from alerting, in a worker thread. Stored lines may hold
bare NaN tokens, so answers that carry records or findings spell them as docs/format.md
does (``wire.stored_to_wire``, ``wire.dumps``).

``GET /v1/runs`` lists the stored runs, oldest first; ``GET /v1/runs/gpt-7`` is one run's
status, findings and alerts (and, while it is in memory, each rank's latest values);
``GET /v1/runs/gpt-7/records?since_step=100&kind=step&limit=10`` its stored records, oldest
step first (``kind`` may repeat; ``since_step=-1`` includes the run record; the run's
current history unless ``attempt=N`` asks for what one attempt sent, pipeline/attempts.py); and
``GET /v1/runs/gpt-7/findings`` its findings, newest first. Lists are pages of at most
``limit`` items and ``read_page_bytes`` of stored bytes, written chunk by chunk
(api/streamed_page.py); ``"next"`` is the link to the following page (``after=`` a run's
FIRST_SEEN:RUN_ID, or a record's STEP:KIND:RANK; ``before=`` a finding's id), null once
nothing follows.
reads/queries.py shows the read side's answers built from a run; tests/api/test_ingest.py
reads these routes over real HTTP.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any
from urllib.parse import quote, urlencode

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool

from monitor_agent.api.deps import (
    AlertingDep,
    QueriesDep,
    ReadSlotsDep,
    RunnerDep,
    ServicesDep,
    require_read,
)
from monitor_agent.api.models import FindingsOut, RecordsOut, RunDetailOut, RunsListOut
from monitor_agent.api.streamed_page import Page, streamed
from monitor_agent.reads.views import RunDetail
from monitor_agent.records import wire
from monitor_agent.storage.store import KIND_ORDER

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])
KINDS = KIND_ORDER
AFTER = rf"^-?[0-9]{{1,19}}:({'|'.join(KINDS)}):[0-9]{{1,19}}$"
"""A record's key as a page's ``next`` writes it: every stored kind (``KIND_ORDER``), so a
page that ends on a hang or an agreement record has a link this route takes."""


@router.get("/v1/runs", response_model=RunsListOut,
            summary="Stored runs, oldest first, a page at a time")
async def list_runs(
    queries: QueriesDep, runner: RunnerDep, services: ServicesDep, slots: ReadSlotsDep,
    limit: int = Query(1000, ge=1, le=10_000),
    after: str | None = Query(None, max_length=600, pattern=r"^[0-9.e+-]{1,40}:.", description=(
        "Continue after this run (FIRST_SEEN:RUN_ID), as the previous page's `next` says.")),
) -> Response:
    start = None
    if after is not None:
        seen, _, after_run = after.partition(":")
        try:
            start = (float(seen), after_run)
        except ValueError:
            raise HTTPException(
                422, f"after: {seen!r} is not a time; use the `next` link") from None

    async def fetch(key: Any, max_rows: int, max_bytes: int) -> Any:
        return await runner.call(queries.listings_chunk, key, max_rows, max_bytes)

    def link(key: tuple[float, str]) -> str:
        return f"/v1/runs?{urlencode([('limit', limit), ('after', f'{key[0]!r}:{key[1]}')])}"

    page = Page(b'{"runs":[', fetch, limit, services.settings.read_page_bytes, link)
    return await streamed(slots, page, start, "")


@router.get("/v1/runs/{run_id}", response_model=RunDetailOut,
            summary="Status, latest values, findings and alerts of a run")
async def get_run(run_id: str, queries: QueriesDep, runner: RunnerDep,
                  alerting: AlertingDep) -> Response:
    found = await runner.call(queries.run_detail, run_id)
    if found is None:
        raise HTTPException(404, f"no run {run_id!r}")
    # The alert database has its own lock: read it in a worker, not on the engine thread.
    alerts = await run_in_threadpool(alerting.alerts_for_run, run_id)
    return _json(_detail(found, [a.to_dict() for a in alerts]))


def _detail(run: RunDetail, alerts: list[dict[str, Any]]) -> dict[str, Any]:
    detail: dict[str, Any] = {
        "run_id": run.run_id,
        "status": run.status,
        "active": run.active,
        "first_seen": run.first_seen,
        "last_seen": run.last_seen,
        "ended_at": run.ended_at,
        "run": run.run,
        "findings": {"by_type": run.finding_counts, "recent": run.recent_findings},
        "alerts": alerts,
        "last_step": run.last_step,
        "attempts": [asdict(a) for a in run.attempts],
        "verdict": run.verdict.to_dict() if run.verdict is not None else None,
        "phase": run.phase,
        "leader": run.leader,
    }
    if run.ranks is not None:  # in memory: what only live state knows
        detail["ranks"] = run.ranks
    return detail


@router.get("/v1/runs/{run_id}/records", response_model=RecordsOut,
            summary="Stored records of a run, oldest first, a page at a time")
async def get_records(
    run_id: str,
    queries: QueriesDep,
    runner: RunnerDep,
    services: ServicesDep,
    slots: ReadSlotsDep,
    since_step: int = Query(0, ge=-1, le=2**62,  # SQLite integers are 64-bit
                            description="First step to return (-1 includes the run record)."),
    limit: int = Query(1000, ge=1, le=10_000),
    kind: list[str] = Query(default_factory=list, description="Only these kinds."),
    after: str | None = Query(None, pattern=AFTER, description=(
        "Continue after this record (STEP:KIND:RANK), as the previous page's `next` says.")),
    attempt: int | None = Query(None, ge=1, le=2**31, description=(
        "Everything this attempt of the run sent, replaced steps included; by default the "
        "current history (records no later attempt replaced).")),
) -> Response:
    bad = [k for k in kind if k not in KINDS]
    if bad:
        raise HTTPException(422, f"kind: unknown kind(s) {bad}; use {', '.join(KINDS)}")
    start = None
    if after is not None:
        step, name, rank = after.split(":")
        start = (int(step), KINDS.index(name), int(rank))
        if not (-1 <= start[0] <= 2**62 and start[2] <= 2**62):  # SQLite integers: 64-bit
            raise HTTPException(422, f"after: {after!r} is out of range; use the `next` link")

    async def fetch(key: Any, max_rows: int, max_bytes: int) -> Any:
        return await runner.call(queries.records_chunk, run_id, since_step, key, kind,
                                 max_rows, max_bytes, attempt)

    def link(key: tuple[int, int, int]) -> str:
        params = [("since_step", since_step), ("limit", limit), *(("kind", k) for k in kind),
                  *((("attempt", attempt),) if attempt is not None else ()),
                  ("after", f"{key[0]}:{KINDS[key[1]]}:{key[2]}")]
        return f"/v1/runs/{quote(run_id, safe='')}/records?{urlencode(params)}"

    page = Page(_head(run_id, "records"), fetch, limit, services.settings.read_page_bytes, link,
                records=True)
    return await streamed(slots, page, start, f"no run {run_id!r}")


@router.get("/v1/runs/{run_id}/findings", response_model=FindingsOut,
            summary="Findings of a run, newest first, a page at a time")
async def get_findings(
    run_id: str, queries: QueriesDep, runner: RunnerDep, services: ServicesDep,
    slots: ReadSlotsDep, limit: int = Query(100, ge=1, le=10_000),
    before: int | None = Query(None, ge=1, le=2**62, description=(
        "Only findings older than this one, as the previous page's `next` says.")),
    current: bool = Query(False, description=(
        "Only findings about the run's current history, not about steps a later attempt "
        "replaced (what the run page marks).")),
) -> Response:
    async def fetch(key: int | None, max_rows: int, max_bytes: int) -> Any:
        return await runner.call(queries.findings_chunk, run_id, key, max_rows, max_bytes,
                                 current)

    def link(key: int) -> str:
        params = urlencode([("limit", limit), *((("current", "true"),) if current else ()),
                            ("before", key)])
        return f"/v1/runs/{quote(run_id, safe='')}/findings?{params}"

    page = Page(_head(run_id, "findings"), fetch, limit, services.settings.read_page_bytes,
                link)
    return await streamed(slots, page, before, "")


def _head(run_id: str, items: str) -> bytes:
    return b'{"run_id":' + wire.dumps(run_id) + b',"' + items.encode() + b'":['


def _json(obj: Any) -> Response:
    return Response(wire.dumps(obj), media_type="application/json")
