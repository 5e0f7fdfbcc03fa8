"""A pending rollback whose checkpoint turns suspect is withdrawn and decided again, over
real HTTP: two ranks NaN at step 300 (and are finite again at 301), and the plan goes back to the
save at 270. Then a third
rank's records arrive, late, with a NaN at step 266: the save at 270 holds damaged weights.
The plan is withdrawn for one to 250, under the same rollback number. The ranks' next
answers and the actions endpoint serve the new plan, and a resume at 251 applies it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

RUN = "rev"
RULES = """
routes: {page: [console]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: [rank]
    action: rollback
    rollback_skip_margin: 10
"""


def _step(step: int, rank: int, loss: float | str = 2.0, token: str = "a") -> dict[str, Any]:
    return {"kind": "step", "run_id": RUN, "rank": rank, "step": step, "time": 1000.0 + step,
            "loss": loss, "grad_norm": 1.0, "data_position": step, "attempt": f"{token}{rank}"}


def _ckpt(step: int) -> dict[str, Any]:
    return {"kind": "checkpoint", "run_id": RUN, "rank": 0, "step": step,
            "time": 1000.5 + step, "path": f"/ckpt/{step}.pt", "attempt": "a0"}


def _post(srv: LiveServer, records: list[dict[str, Any]]) -> dict[str, Any]:
    r = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_plan_whose_checkpoint_turns_suspect_is_revised_and_the_ranks_get_the_new_one(
        tmp_path: Path):
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    settings = load_settings(data_dir=tmp_path / "data", alerting={
        "rules_file": str(rules), "group_wait_seconds": 0.05})
    with LiveServer(settings) as srv:
        for start in range(1, 300, 50):
            batch = [_step(s, r) for s in range(start, min(start + 50, 300)) for r in (0, 1)]
            batch += [_ckpt(s) for s in (250, 270) if start <= s < start + 50]
            _post(srv, batch)
        [decided] = _post(srv, [_step(300, 0, "NaN"), _step(300, 1, "NaN")])["actions"]
        assert decided["plan"]["checkpoint_step"] == 270, decided
        _post(srv, [_step(301, 0), _step(301, 1)])  # one bad batch: finite again

        # Rank 2's records come late: its NaN at 266 was before the save at 270.
        _post(srv, [_step(s, 2) for s in range(1, 266)])
        answer = _post(srv, [_step(266, 2, "NaN")])
        [revised] = [a for a in answer["actions"] if a["id"] != decided["id"]]
        assert (revised["plan"]["checkpoint_step"], revised["plan"]["number"]) == (250, 1)
        assert decided["id"] not in [a["id"] for a in answer["actions"]]
        polled = httpx.get(f"{srv.url}/v1/runs/{RUN}/actions", timeout=10).json()["actions"]
        assert [(a["id"], a["withdrawn_by"]) for a in polled] == [
            (decided["id"], revised["id"]), (revised["id"], None)]
        ledger = httpx.get(f"{srv.url}/v1/runs/{RUN}/checkpoints", timeout=10).json()
        assert ledger["last_clean"]["step"] == 250

        # The ranks reload 250 and go on at 251: the new plan is applied.
        _post(srv, [_step(s, r, token="b") for s in range(251, 256) for r in (0, 1, 2)])
        polled = httpx.get(f"{srv.url}/v1/runs/{RUN}/actions", timeout=10).json()["actions"]
        assert [(a["id"], a["honoured_step"]) for a in polled] == [
            (decided["id"], None), (revised["id"], 251)]
