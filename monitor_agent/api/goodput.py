"""``GET /v1/runs/{run_id}/goodput``: where the run's time went.

Wall-clock time since the run started, split into productive training and badput by cause
(start-up, input, checkpoints, eval, hangs, restarts, rollbacks, skipped steps, the
straggler tax, unaccounted), per run and per attempt, with each incident's cost
(runs/goodput.py). Read on the engine thread; a run out of memory answers from its ledger
as last kept. tests/api/test_goodput.py reads it over real HTTP.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Depends, HTTPException

from monitor_agent.api.deps import QueriesDep, RunnerDep, require_read
from monitor_agent.api.models import GoodputOut

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])


@router.get("/v1/runs/{run_id}/goodput", response_model=GoodputOut,
            summary="Where the run's time went: productive and badput by cause")
async def get_goodput(run_id: str, queries: QueriesDep, runner: RunnerDep) -> dict[str, Any]:
    found = await runner.call(queries.goodput, run_id, time.time())
    if found is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return found
