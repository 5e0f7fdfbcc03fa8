"""A preview (a NaN step a client sends ahead of its spooled backlog) of a multi-node run
pages nothing on the run's leader: the step's in-order copy is judged there with every
node's ranks, and a node sidecar's page made while the leader was away arrives with the
node's digests. Seen in tests/e2e/test_multi_node.py: the leader restarted, its ranks
previewed their spooled NaN step ("rank 0: grad_norm is nan") before node 1 caught it up
with the page it had sent meanwhile ("NaN first on rank 2 ..."), and the job got two pages.
A single-node run's preview still pages at once (the canary here)."""

from __future__ import annotations

import json

import httpx
import pytest

from monitor_agent.serving.embedded import EmbeddedServer, free_port
from monitor_agent.settings import Settings
from tests.eventually import eventually
from tests.receivers import Receiver

pytestmark = pytest.mark.timeout(60)


def _post(url: str, path: str, records: list[dict]) -> None:
    resp = httpx.post(url + path, content=json.dumps({"records": records}),
                      headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 200, resp.text


def _run(run_id: str, rank: int, nodes: int) -> dict:
    record = {"kind": "run", "run_id": run_id, "rank": rank, "time": 1.0,
              "attempt": f"t{rank}", "hardware": {"reporting_ranks": 2 * nodes}}
    if nodes > 1:
        record["cluster"] = {"node_rank": 0, "nodes": nodes, "local_world_size": 2}
    return record


def _step(run_id: str, rank: int, step: int, nan: bool = False) -> dict:
    return {"kind": "step", "run_id": run_id, "rank": rank, "step": step,
            "time": 1000.0 + step, "attempt": f"t{rank}", "loss": 2.0,
            "grad_norm": "NaN" if nan else 1.0}


def test_the_leader_of_a_multi_node_run_pages_no_preview(tmp_path):
    with Receiver("slack") as slack:
        settings = Settings(port=free_port(), data_dir=tmp_path, alerting={
            "group_wait_seconds": 0.05,
            "slack": {"webhook_url": slack.url + "/hook", "min_interval_seconds": 0}})
        with EmbeddedServer(settings) as srv:
            for run_id, nodes in (("job", 2), ("canary", 1)):
                _post(srv.url, "/v1/records", [_run(run_id, r, nodes) for r in (0, 1)]
                      + [_step(run_id, r, s) for s in range(1, 6) for r in (0, 1)])
            _post(srv.url, "/v1/records/preview", [_step("job", 0, 8, nan=True)])
            _post(srv.url, "/v1/records/preview", [_step("canary", 0, 8, nan=True)])
            eventually(lambda: any("run canary:" in r.body.decode() for r in slack.accepted()),
                       timeout=20, what="the single-node preview's page")
            assert not [r.body for r in slack.accepted() if "run job:" in r.body.decode()]
