"""``GET /v1/ui/runs``: one line per run for the runs page, with its firing alerts.

A line is the pipeline's ``RunSummary`` plus what alerting knows (derived from it, as
``api/models.py`` derives answers from the internal views). The runs page (ui/) fetches it
with the token the user typed.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from fastapi import APIRouter, Depends, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from monitor_agent.api.deps import AlertingDep, QueriesDep, ReadSlotsDep, RunnerDep, require_read
from monitor_agent.api.streamed_page import SLOT_WAIT, answered
from monitor_agent.reads.views import RunSummary

router = APIRouter(tags=["ui"], dependencies=[Depends(require_read)])


@dataclass(frozen=True, slots=True)
class RunSummaryOut(RunSummary):
    # No docstring: the OpenAPI page would show it as the model's description.
    firing_alerts: int


class RunsOut(BaseModel):
    runs: list[RunSummaryOut]


@router.get("/v1/ui/runs", response_model=RunsOut, summary="One line per run for the runs page")
async def get_runs(queries: QueriesDep, runner: RunnerDep, alerting: AlertingDep,
                   slots: ReadSlotsDep) -> Response:
    await run_in_threadpool(slots.take, SLOT_WAIT)  # a large read (api/streamed_page.py)
    try:
        firing: dict[str, int] = {}
        # The alert database has its own lock: read it in a worker, not on the event loop.
        for alert in await run_in_threadpool(alerting.list_alerts, state="firing",
                                             limit=10_000):
            firing[alert.run_id] = firing.get(alert.run_id, 0) + 1
        # Field by field, not asdict: the verdict stays a Verdict, as the model declares it.
        rows = [RunSummaryOut(**{f.name: getattr(s, f.name) for f in fields(s)},
                              firing_alerts=firing.get(s.run_id, 0))
                for s in await runner.call(queries.run_summaries)]
        body = await run_in_threadpool(lambda: RunsOut(runs=rows).model_dump_json().encode())
        return answered(slots, body)
    except BaseException:
        slots.give()
        raise
