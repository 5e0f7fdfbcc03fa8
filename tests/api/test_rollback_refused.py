"""A rollback the job refuses to load becomes a stop, over real HTTP (issue 49): the client
holds back a plan whose checkpoint no process of the job saved (its ``agreement`` record,
outcome ``unreported``) and stops rather than train on from the fault. The sidecar withdraws
the plan for a stop, so the run's phase and page say it stopped, not that it waits for a
relaunch that will never come, and its rule decides no new rollback. A plan a rank merely
lacks (``missing``) stays an order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from tests.live_server import LiveServer
from tests.rollback_sidecar import post, rollback_sidecar


def _step(run: str, step: int, loss: float | str = 2.0) -> dict[str, Any]:
    return {"kind": "step", "run_id": run, "step": step, "time": 1000.0 + step, "loss": loss,
            "grad_norm": 1.0, "data_position": step, "attempt": "a"}


def _held(run: str, action_id: int, outcome: str, step: int) -> dict[str, Any]:
    return {"kind": "agreement", "run_id": run, "rank": 0, "step": step, "time": 1000.0 + step,
            "attempt": "a", "action_id": action_id, "action": "rollback", "outcome": outcome,
            "rounds": 1, "check_every": 1, "detail": "no rank of this job reported it"}


def _get(srv: LiveServer, path: str) -> dict[str, Any]:
    return httpx.get(srv.url + path, timeout=10).json()


def _decided(srv: LiveServer, run: str) -> dict[str, Any]:
    post(srv, [_step(run, s) for s in range(1, 21)] + [
        {"kind": "checkpoint", "run_id": run, "step": 10, "time": 1010.5,
         "path": "/ckpt/10.pt", "attempt": "a"}])
    [plan] = post(srv, [_step(run, 21, "NaN")])["actions"]
    assert plan["action"] == "rollback" and plan["plan"]["checkpoint_step"] == 10, plan
    return plan


def test_a_refused_rollback_is_withdrawn_for_a_stop_and_the_run_ends_stopped(tmp_path: Path):
    with rollback_sidecar(tmp_path) as srv:
        plan = _decided(srv, "refused")
        answer = post(srv, [_step("refused", 22, "NaN"), _held("refused", plan["id"],
                                                                "unreported", 22)])
        [stop] = [a for a in answer["actions"] if a["id"] != plan["id"]]
        assert stop["action"] == "stop" and stop["message"].startswith(
            f"rollback {plan['id']} refused by the job: it names a checkpoint no process of "
            "the job saved (/ckpt/10.pt); stopping; a human must look"), stop
        polled = _get(srv, "/v1/runs/refused/actions")["actions"]
        assert [(a["action"], a["withdrawn_by"]) for a in polled] == [
            ("rollback", stop["id"]), ("stop", None)]
        # The NaN goes on until the client's stop: no new rollback is decided.
        post(srv, [_step("refused", 23, "NaN")])
        post(srv, [{"kind": "end", "run_id": "refused", "step": 23, "time": 1024.0,
                     "attempt": "a", "status": "stopped",
                     "error": "stopped at step 23: rollback plan 1 ... not loaded"}])
        polled = _get(srv, "/v1/runs/refused/actions")["actions"]
        assert [(a["action"], a["honoured_step"]) for a in polled] == [
            ("rollback", None), ("stop", 23)]
        run = _get(srv, "/v1/runs/refused")
        assert run["status"] == "stopped" and "waiting for relaunch" not in run["phase"], run
        assert run["verdict"]["state"] == "unhealthy", run["verdict"]
        findings = _get(srv, "/v1/runs/refused/findings")["findings"]
        [held] = [f for f in findings if f["type"] == "action_held"]
        assert held["message"].endswith("no rank loads it, and the job stops rather than "
                                        "train on from the fault"), held["message"]


def test_a_plan_a_rank_lacks_stays_an_order(tmp_path: Path):
    with rollback_sidecar(tmp_path) as srv:
        plan = _decided(srv, "lacks")
        answer = post(srv, [_held("lacks", plan["id"], "missing", 22)])
        assert [a["id"] for a in answer["actions"]] == [plan["id"]]
        polled = _get(srv, "/v1/runs/lacks/actions")["actions"]
        assert [(a["action"], a["withdrawn_by"]) for a in polled] == [("rollback", None)]
