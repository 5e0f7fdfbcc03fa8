"""``/v1/runs``: what the sidecar knows about each run, and its stored history.

Everything about a run comes from the read side (``RunQueries``), called on the engine thread
(``runner.call``); its alerts come from alerting, in a worker thread. Stored lines may hold
bare NaN tokens, so answers that carry records or findings are written with ``wire.dumps``
(docs/format.md's string spelling).

``GET /v1/runs`` lists every stored run; ``GET /v1/runs/gpt-7`` is one run's status,
findings and alerts (and, while it is in memory, each rank's latest values);
``GET /v1/runs/gpt-7/records?since_step=100&kind=step&limit=10`` its stored records, oldest
step first (``kind`` may repeat; ``since_step=-1`` includes the run record); and
``GET /v1/runs/gpt-7/findings`` its findings, newest first. pipeline/queries.py shows the
read side's answers built from a run; tests/api/test_ingest.py reads these routes over real
HTTP.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import APIRouter, Depends, HTTPException, Query, Response
from fastapi.concurrency import run_in_threadpool

from monitor_agent.api.deps import AlertingDep, QueriesDep, RunnerDep, require_read
from monitor_agent.api.models import FindingsOut, RecordsOut, RunDetailOut, RunsListOut
from monitor_agent.pipeline.views import RunDetail
from monitor_agent.records import wire

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])
KINDS = ("run", "step", "eval", "end")


@router.get("/v1/runs", response_model=RunsListOut,
            summary="Every run the sidecar has stored, newest last")
async def list_runs(queries: QueriesDep, runner: RunnerDep) -> dict[str, Any]:
    listings = await runner.call(queries.run_listings)
    return {"runs": [asdict(r) for r in listings]}


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
        "verdict": run.verdict.to_dict() if run.verdict is not None else None,
    }
    if run.ranks is not None:  # in memory: what only live state knows
        detail["last_step"] = run.last_step
        detail["ranks"] = run.ranks
    return detail


@router.get("/v1/runs/{run_id}/records", response_model=RecordsOut,
            summary="Stored records of a run, oldest first")
async def get_records(
    run_id: str,
    queries: QueriesDep,
    runner: RunnerDep,
    since_step: int = Query(0, ge=-1, le=2**62,  # SQLite integers are 64-bit
                            description="First step to return (-1 includes the run record)."),
    limit: int = Query(1000, ge=1, le=10_000),
    kind: list[str] = Query(default_factory=list, description="Only these kinds."),
) -> Response:
    bad = [k for k in kind if k not in KINDS]
    if bad:
        raise HTTPException(422, f"kind: unknown kind(s) {bad}; use run, step, eval, end")
    bodies = await runner.call(queries.stored_records, run_id, since_step, limit, kind)
    if bodies is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return _json({"run_id": run_id, "records": [wire.loads(b) for b in bodies]})


@router.get("/v1/runs/{run_id}/findings", response_model=FindingsOut,
            summary="Findings of a run, newest first")
async def get_findings(run_id: str, queries: QueriesDep, runner: RunnerDep,
                       limit: int = Query(100, ge=1, le=10_000)) -> Response:
    bodies = await runner.call(queries.stored_findings, run_id, limit)
    return _json({"run_id": run_id, "findings": [wire.loads(b) for b in bodies]})


def _json(obj: Any) -> Response:
    return Response(wire.dumps(obj), media_type="application/json")
