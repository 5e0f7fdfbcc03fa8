"""``GET /v1/node``: whether a run's leader left this sidecar's node out, and why; ``DELETE
/v1/node/drain``: it is back in service.

A ``restart`` or ``exclude`` action that leaves this node out drains it (cluster/drain.py):
the cluster's own tooling reads that here. Node Problem Detector's custom plugin
(deploy/kubernetes/node-problem-detector/) turns ``drained`` into a node condition, which
cordons the node; a Slurm node is drained by ``scontrol`` at the decision. Once the node is
repaired an operator clears it (``DELETE``, with the write token), as ``scontrol update
State=RESUME`` returns a Slurm node. tests/api/test_node.py asks both over real HTTP.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, HTTPException

from monitor_agent.api.deps import ServicesDep, require_read, require_write
from monitor_agent.api.models import NodeOut
from monitor_agent.cluster.drain import NodeDrain

router = APIRouter(tags=["node"])


def _drain(services: ServicesDep) -> NodeDrain:
    if services.node_drain is None:  # the storage gate answers first; this keeps types honest
        raise HTTPException(503, "not ready: starting; retry later")
    return services.node_drain


@router.get("/v1/node", response_model=NodeOut, dependencies=[Depends(require_read)],
            summary="Whether a run's leader left this node out (for Node Problem Detector)")
async def get_node(services: ServicesDep) -> dict[str, Any]:
    return {"sidecar": services.sidecar, **_drain(services).to_dict()}


@router.delete("/v1/node/drain", response_model=NodeOut,
               dependencies=[Depends(require_write)],
               summary="The node is back in service: clear its drain")
async def clear_drain(services: ServicesDep) -> dict[str, Any]:
    drain = _drain(services)
    drain.clear()
    return {"sidecar": services.sidecar, **drain.to_dict()}
