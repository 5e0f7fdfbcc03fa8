"""``GET /v1/runs/{run_id}/actions``: the cheap poll for actions rules took (stop, checkpoint).

The ingest response already carries the actions a batch caused; this endpoint is for the
other ranks of the run and for clients that missed an answer. One indexed SQLite read,
no run state touched. ``stop`` says whether any stop was ever requested for the run.

A poller asks ``GET /v1/runs/gpt-7/actions?after=<last_id>`` and sends the answer's
``last_id`` as its next ``after``; it stops the run when ``stop`` is true. monitor_client
polls it (``client/monitor_client/_transport.py``, ``actions``), and
tests/api/test_actions.py polls it over real HTTP.
"""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Response
from fastapi.concurrency import run_in_threadpool

from monitor_agent.api.deps import AlertingDep, require_read
from monitor_agent.api.models import ActionsOut

router = APIRouter(tags=["actions"], dependencies=[Depends(require_read)])


@router.get("/v1/runs/{run_id}/actions", response_model=ActionsOut,
            summary="Actions rules took for a run (poll with after=)")
async def get_actions(
    run_id: str,
    alerting: AlertingDep,
    after: int = Query(0, ge=0, le=2**62, description="Only actions with a larger id."),
    limit: int = Query(100, ge=1, le=1000),
) -> Response:
    # The alert database has its own lock: no need to queue behind the engine thread.
    found = await run_in_threadpool(alerting.actions_for_run, run_id, after, limit)
    stop = any(a.action == "stop" for a in found)
    if not stop and after > 0:  # a stop taken before ``after`` still stands
        stop = await run_in_threadpool(alerting.stop_requested, run_id)
    answer = ActionsOut(run_id=run_id, actions=found, stop=stop,
                        last_id=found[-1].id if found else after)
    # Written here, as the ingest answer is: the actions as ``Action.to_dict`` writes them.
    return Response(answer.model_dump_json(), media_type="application/json")
