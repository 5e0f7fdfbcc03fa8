"""``GET /v1/runs/{run_id}/checkpoints``: the run's checkpoint ledger, each one judged.

The checkpoints the trainer reported (``checkpoint`` records, docs/format.md) of the run's
current history, oldest first, each ``clean`` or ``suspect`` with the reason, and the last
clean one: which save is safe to go back to, so the person paged at 3 AM need not work
it out. Judged on the engine thread from the run's findings as they stand now
(pipeline/checkpoint_ledger.py), so a fault found after a save can make it suspect later.
tests/api/test_checkpoints.py reads it over real HTTP.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException

from monitor_agent.api.deps import QueriesDep, RunnerDep, require_read
from monitor_agent.api.models import CheckpointsOut

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])


@router.get("/v1/runs/{run_id}/checkpoints", response_model=CheckpointsOut,
            summary="The run's checkpoints, each clean or suspect, and the last clean one")
async def get_checkpoints(run_id: str, queries: QueriesDep,
                          runner: RunnerDep) -> dict[str, Any]:
    found = await runner.call(queries.checkpoints, run_id)
    if found is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return found
