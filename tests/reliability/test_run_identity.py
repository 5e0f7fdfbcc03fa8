"""Hostile input, part four, class 1: nothing bound a record to the process that owns its run.

Over real HTTP against a real sidecar, with the shared write token: a checkpoint planted
into another run's attempt, a second job on the same run id, client-controlled numbers
that switched checks off. Each is refused, or judged and paged, as docs/format.md ("Who may
write what") says. (The client's side, the plan it refuses and its private spool, is in
tests/client/test_rollback_plan.py and tests/client/test_spool.py.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer


@pytest.fixture
def srv(tmp_path: Path):
    with LiveServer(load_settings(data_dir=tmp_path, tick_interval_seconds=0.05)) as server:
        yield server


def _post(srv: LiveServer, records: list[dict[str, Any]]) -> httpx.Response:
    return httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=10)


def _steps(run: str, steps: range, token: str | None, rank: int = 0, t0: float = 1000.0,
           loss: Any = 2.0) -> list[dict[str, Any]]:
    out = [{"kind": "step", "run_id": run, "rank": rank, "step": s, "time": t0 + s,
            "loss": loss, "grad_norm": 1.0} for s in steps]
    return [{**r, "attempt": token} for r in out] if token else out


def _ckpt(run: str, step: int, path: str, token: str | None, rank: int = 0) -> dict[str, Any]:
    record = {"kind": "checkpoint", "run_id": run, "rank": rank, "step": step,
              "time": 1000.0 + step, "path": path}
    return {**record, "attempt": token} if token else record


def _ledger(srv: LiveServer, run: str) -> list[tuple[int, str]]:
    r = httpx.get(f"{srv.url}/v1/runs/{run}/checkpoints", timeout=10)
    r.raise_for_status()
    return [(c["step"], c["path"]) for c in r.json()["checkpoints"]]


def test_a_checkpoint_from_a_process_that_never_trained_in_the_attempt_is_refused(srv):
    run = "victim"
    assert _post(srv, [{"kind": "run", "run_id": run, "rank": r, "attempt": f"v{r}",
                        "hardware": {"world_size": 2}} for r in (0, 1)]).status_code == 200
    assert _post(srv, _steps(run, range(1, 102), "v0") + _steps(run, range(1, 102), "v1",
                                                               rank=1)).status_code == 200
    planted = "/tmp/evil/step-101.pt"
    for record, field in (
            (_ckpt(run, 101, planted, None, rank=1), "attempt"),   # no token: the old way in
            (_ckpt(run, 101, planted, "evil", rank=0), "attempt"),  # a token nobody used
            (_ckpt(run, 101, planted, "v0", rank=3), "rank")):    # a rank that never trained
        r = _post(srv, [record])
        assert r.status_code == 422 and f"{field}:" in r.text, r.text
    # A process that joined the attempt without training in it (a run record of a new
    # rank under a fresh token) still may not write its checkpoint.
    assert _post(srv, [{"kind": "run", "run_id": run, "rank": 5,
                        "attempt": "joined"}]).status_code == 200
    r = _post(srv, [_ckpt(run, 101, planted, "joined", rank=5)])
    assert r.status_code == 422 and "rank 5 sent no step in attempt 1" in r.text
    # The run's own save of that step is taken, and is the only one in its ledger.
    ok = _post(srv, [_ckpt(run, 101, "/ckpt/step-101.pt", "v0")])
    assert ok.status_code == 200 and ok.json()["accepted"] == 1, ok.text
    assert _ledger(srv, run) == [(101, "/ckpt/step-101.pt")]
    # A checkpoint right after its rank's first step, in the same batch, is taken.
    r = _post(srv, _steps("fresh", range(1, 3), "tok") +
              [_ckpt("fresh", 2, "/ckpt/2.pt", "tok")]).json()
    assert (r["accepted"], r["rejected"]) == (3, [])
    # An old client, without tokens, keeps its checkpoints too.
    r = _post(srv, _steps("legacy", range(1, 3), None) +
              [_ckpt("legacy", 2, "/ckpt/2.pt", None)]).json()
    assert (r["accepted"], r["rejected"]) == (3, [])


def test_a_new_rank_s_first_step_is_checked_against_the_run(srv):
    assert _post(srv, _steps("jump", range(1, 11), "a")).status_code == 200
    r = _post(srv, _steps("jump", range(2**53, 2**53 + 1), "b", rank=5, t0=1000.0 - 2**53))
    assert r.status_code == 422 and "implausible for run jump rank 5" in r.text
    # So the future-checkpoint check still holds: nothing moved the run's latest step.
    r = _post(srv, [_ckpt("jump", 500, "/ckpt/500.pt", "a")])
    assert r.status_code == 422 and "in the future" in r.text
    assert _post(srv, _steps("jump", range(11, 12), "b", rank=5)).status_code == 200


def _hang(run: str, rank: int) -> dict[str, Any]:
    return {"kind": "hang", "run_id": run, "rank": rank, "step": 3, "time": 2000.0,
            "stuck_seconds": 90.0, "limit_seconds": 60.0}


@pytest.mark.parametrize("size", [4.0, "4", True, 0, 2_000_000])
def test_world_size_is_a_checked_integer(srv, size):
    r = _post(srv, [{"kind": "run", "run_id": "ws", "hardware": {"world_size": size}}])
    assert r.status_code == 422 and "hardware.world_size" in r.text, r.text
    r = _post(srv, [{"kind": "run", "run_id": "ws", "hardware": {"reporting_ranks": size}}])
    assert r.status_code == 422 and "hardware.reporting_ranks" in r.text, r.text


def test_a_hang_must_come_from_a_rank_of_the_run(srv):
    _post(srv, [{"kind": "run", "run_id": "sized", "hardware": {"world_size": 4}}])
    _post(srv, _steps("sized", range(1, 4), None))
    assert _post(srv, [_hang("sized", 4)]).status_code == 422
    assert _post(srv, [_hang("sized", 3)]).status_code == 200
    # No world size declared: only a rank that stepped may say it is stuck.
    _post(srv, _steps("unsized", range(1, 4), None))
    r = _post(srv, [_hang("unsized", 7)])
    assert r.status_code == 422 and "declares no world_size" in r.text
    assert _post(srv, [_hang("unsized", 0)]).status_code == 200
    fresh = _post(srv, _steps("unsized", range(1, 4), None, rank=1) + [_hang("unsized", 1)])
    assert fresh.json()["rejected"] == []  # its step earlier in the same batch counts


def _findings(srv: LiveServer, run: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{srv.url}/v1/runs/{run}/findings", params={"limit": 100}, timeout=10)
    r.raise_for_status()
    return r.json()["findings"]


def test_a_second_live_job_on_one_run_id_waits_and_is_paged_the_first_keeps_its_history(
        tmp_path: Path):
    """Hostile input, part five: one record under a fresh token no longer replaces a job
    that is sending (pipeline/attempts.py ``holds_history``). The second job's records get
    409 (its client keeps them and retries); the first job's NaN is judged as the run's,
    by its rules; a second job still refused once a job would have stopped is paged as
    two_jobs; when the first job ends, the second's next try begins its attempt."""
    run = "shared-id"
    settings = load_settings(data_dir=tmp_path, tick_interval_seconds=0.05,
                             attempt_quiet_seconds=1.0)
    with LiveServer(settings) as srv:
        assert _post(srv, _steps(run, range(1, 51), "job-a")).status_code == 200
        second = _post(srv, _steps(run, range(1, 6), "job-b"))
        assert second.status_code == 409 and "is live" in second.text, second.text
        nan = _post(srv, _steps(run, range(51, 52), "job-a", loss="NaN")).json()
        assert nan["accepted"] == 1 and nan["late"] == 0
        # Job A keeps training; job B keeps trying (as its client does, with its records).
        step = 52

        def b_paged() -> bool:
            nonlocal step
            assert _post(srv, _steps(run, range(step, step + 1), "job-a")).status_code == 200
            step += 1
            assert _post(srv, _steps(run, range(1, 6), "job-b")).status_code == 409
            return any(f["type"] == "two_jobs" for f in _findings(srv, run))

        eventually(b_paged, timeout=15, interval=0.2, what="job B paged as a second job")
        found = {f["type"]: f for f in _findings(srv, run)}
        assert found["nan_inf"]["attempt"] == 1 and found["nan_inf"]["step"] == 51
        assert found["nan_inf"]["evidence"].get("view") != "partial"  # the run's own
        assert "attempt 2 (rank 0) has tried for" in found["two_jobs"]["message"]
        # Once: job B's next refusal is not paged again.
        _post(srv, _steps(run, range(1, 6), "job-b"))
        assert [f["type"] for f in _findings(srv, run)].count("two_jobs") == 1
        # Job A ends: job B's next try begins its attempt, restarting the run id.
        ended = {"kind": "end", "run_id": run, "step": step - 1, "time": 2000.0,
                 "attempt": "job-a"}
        assert _post(srv, [ended]).status_code == 200
        began = _post(srv, _steps(run, range(1, 6), "job-b")).json()
    assert [a["kind"] for a in began["attempts"]] == ["restarted"]
