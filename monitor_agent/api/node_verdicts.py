"""``GET /v1/runs/{run_id}/nodes``: each node of a multi-node run judged healthy, suspect
or sick, with a cause class and, for the node the straggler tax names, whether leaving it
out pays (runs/node_verdict.py). Read on the engine thread; tests/api/test_node_verdicts.py
reads it over real HTTP from a run leader fed by two real node sidecars.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException

from monitor_agent.api.deps import QueriesDep, RunnerDep, require_read
from monitor_agent.api.models import NodesOut

router = APIRouter(tags=["runs"], dependencies=[Depends(require_read)])


@router.get("/v1/runs/{run_id}/nodes", response_model=NodesOut,
            summary="Each node of the run: healthy, suspect or sick, and why")
async def get_nodes(run_id: str, queries: QueriesDep, runner: RunnerDep) -> dict[str, Any]:
    found = await runner.call(queries.node_verdicts, run_id)
    if found is None:
        raise HTTPException(404, f"no run {run_id!r}")
    return found
