"""A kill -9 at every commit boundary of a resume leaves the two databases agreeing after the
restart (pipeline/failpoints.py, ``Consequences.reconcile``): a real sidecar subprocess decides a
rollback for two ranks. The resumed ranks' first batch then kills it at one boundary (it
SIGKILLs itself there), and it restarts without the failpoint. The rollback counts as
applied, the retried batch changes nothing, and the resumed run's next NaN decides the
second rollback and is paged. Before the reconciliation, a kill between the record store
settling the attempt and alerting hearing of it left the first rollback pending forever,
and the next NaN was neither acted on nor paged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor_agent.pipeline.failpoints import BOUNDARIES
from tests.e2e import two_ranks
from tests.eventually import eventually

RUN = "crash"
RULES = """
routes: {page: [pagerduty]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: [rank]
    action: rollback
    rollback_skip_margin: 20
    rollback_budget: 3
"""


def _both(steps: range, token: str, nan_at: int | None = None,
          skipped: int = 0) -> list[dict[str, Any]]:
    return two_ranks.both(RUN, steps, token, nan_at, skipped)


def _actions(url: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/v1/runs/{RUN}/actions", timeout=10)
    r.raise_for_status()
    return r.json()["actions"]


@pytest.mark.parametrize("boundary", BOUNDARIES)
def test_a_kill_at_each_resume_boundary_leaves_the_rollback_applied_and_the_next_fault_paged(
        boundary: str, tmp_path: Path, sidecar_factory, pd_receiver):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    config = tmp_path / "config.yaml"
    config.write_text(f"alerting:\n  rules_file: {rules}\n  group_wait_seconds: 0.05\n"
                      f"  pagerduty: {{routing_key: k-0123456789abcdef0123456789abcd, "
                      f"url: '{pd_receiver.url}/v2/enqueue'}}\n")
    data = tmp_path / "data"
    doomed = sidecar_factory(config=config, data_dir=data,
                             env={"MONITOR_AGENT_FAILPOINT": boundary}).start()
    ckpt = {"kind": "checkpoint", "run_id": RUN, "rank": 0, "step": 20, "time": 1020.5,
            "path": "/ckpt/step-20.pt", "attempt": "a0", "data_position": 20}
    assert doomed.post(_both(range(1, 31), "a") + [ckpt]).json()["accepted"] == 61
    [decided] = doomed.post(_both(range(31, 32), "a", nan_at=31)).json()["actions"]
    assert decided["action"] == "rollback" and decided["plan"]["skip_from"] == 21

    # Both ranks reload step 20 and go on at 21: the sidecar dies at the boundary.
    resumed = _both(range(21, 26), "b", skipped=31)
    with pytest.raises(httpx.TransportError):
        doomed.post(resumed)
    doomed.proc.wait(timeout=30)
    assert f"failpoint {boundary} reached" in doomed.log()

    sc = sidecar_factory(config=config, data_dir=data).start()
    # The client retries the batch it got no answer for; the run goes on.
    assert sc.post(resumed).status_code == 200
    [applied] = _actions(sc.url)
    assert (applied["id"], applied["honoured_step"]) == (decided["id"], 21), applied
    assert sc.post(_both(range(26, 35), "b", skipped=31)).status_code == 200
    # The next NaN decides the second rollback and is paged.
    second = sc.post(_both(range(35, 36), "b", nan_at=35, skipped=31)).json()["actions"]
    assert [(a["action"], a["plan"]["number"]) for a in second] == [("rollback", 2)], second
    eventually(lambda: any(_details(r.json).get("step") == 35
                           for r in pd_receiver.requests if r.json),
               timeout=15, what="the second rollback's page")


def _details(event: dict[str, Any]) -> dict[str, Any]:
    return (event.get("payload") or {}).get("custom_details") or {}
