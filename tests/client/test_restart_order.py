"""The client's side of a restart (client/monitor_client/_restart.py): a process leaves with
exit status 75 on a restart decided while it ran, from its own thread while the training
thread is blocked; never on the restart that relaunched it; not at all when its launcher
would not run it again; and the relaunched process takes the restart's resume point, only
from inside its checkpoint directory. A process per case: leaving ends it."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from actions_stand_in import StandIn

from monitor_client._launcher import detect
from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
TRAINER = textwrap.dedent("""
    import sys, time
    import monitor_client
    url, spool, exit_flag = sys.argv[1], sys.argv[2], sys.argv[3]
    settings = monitor_client.MonitorSettings(
        spool_dir=spool, linger=0.05, watchdog=False, gpu_probe=None,
        restart_exit={"auto": None, "yes": True, "no": False}[exit_flag])
    mon = monitor_client.Monitor(url=url, project="p", run_id="r", settings=settings)
    for step in range(1, 4):
        mon.log_step(step, loss=1.0)
    print("ready", flush=True)
    time.sleep(float(sys.argv[4]))  # the training thread, blocked (a collective that never returns)
    mon.close()
    """)


def _trainer(tmp: Path, url: str, flag: str, block: float, **env: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", TRAINER, url, str(tmp / "spool"), flag, str(block)],
        env={**os.environ, "PYTHONPATH": str(REPO / "client"), **env},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _restart(action_id: int, created_at: float, **plan: object) -> dict:
    return {"id": action_id, "run_id": "r", "action": "restart", "rule": "RestartOnHang",
            "type": "hang", "step": 3, "created_at": created_at, "honoured_step": None,
            "message": "restart all 1 ranks from checkpoint 2",
            "plan": {"cause": "hang", "fault_step": 3, "ranks": 1, "checkpoint_step": 2,
                     "checkpoint_path": "/nowhere/2.pt", **plan}}


def _ready(proc: subprocess.Popen) -> None:
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"


def test_a_restart_decided_while_it_runs_ends_the_blocked_process_with_75(tmp_path):
    stand_in = StandIn()
    try:
        proc = _trainer(tmp_path, stand_in.url, "yes", block=120)
        _ready(proc)
        eventually(lambda: stand_in.of_kind("step"), what="the steps")
        stand_in.publish(_restart(1, created_at=time.time()))
        assert proc.wait(timeout=60) == 75
        err = proc.stderr.read() if proc.stderr else ""
        assert "restart all 1 ranks from checkpoint 2 (action 1, rule RestartOnHang): this " \
               "process exits with 75" in err, err
        assert [r["step"] for r in stand_in.of_kind("step")] == [1, 2, 3]  # delivered first
        [run] = stand_in.of_kind("run")
        assert run["launcher"]["restarts"] is True
    finally:
        stand_in.close()


def test_the_restart_that_relaunched_it_and_a_launcher_that_will_not_leave_it_running(
        tmp_path):
    stand_in = StandIn()
    try:
        stand_in.publish(_restart(1, created_at=time.time() - 5))  # before it began
        relaunched = _trainer(tmp_path / "a", stand_in.url, "yes", block=120)
        _ready(relaunched)
        no_launcher = _trainer(tmp_path / "b", stand_in.url, "auto", block=3)
        _ready(no_launcher)
        eventually(lambda: len(stand_in.of_kind("run")) == 2, what="both run records")
        stand_in.publish(_restart(2, created_at=time.time()))
        assert relaunched.wait(timeout=60) == 75  # restart 2 is for it: it began before
        said = relaunched.stderr.read() if relaunched.stderr else ""
        assert "(action 2, rule RestartOnHang)" in said and "(action 1," not in said, said
        assert no_launcher.wait(timeout=60) == 0
        err = no_launcher.stderr.read() if no_launcher.stderr else ""
        assert "does not leave for it: its launcher does not run it again on exit status " \
               "75" in err, err
        declared = [r["launcher"] for r in stand_in.of_kind("run")]
        assert sorted(d["restarts"] for d in declared) == [False, True]
    finally:
        stand_in.close()


def test_the_relaunched_process_resumes_from_the_restarts_checkpoint_inside_its_dir(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-2.pt").write_bytes(b"weights")
    stand_in = StandIn()
    try:
        import monitor_client

        stand_in.publish(_restart(1, created_at=time.time() - 5,
                                  checkpoint_path=str(ckpt / "step-2.pt"),
                                  resume_position=7, skip=[[3, 5]]))
        stand_in.publish(_restart(2, created_at=time.time() - 4,
                                  checkpoint_path="/etc/passwd", checkpoint_step=1))
        settings = monitor_client.MonitorSettings(spool_dir=tmp_path / "spool", linger=0.05,
                                                  watchdog=False, gpu_probe=None,
                                                  install_hooks=False)
        mon = monitor_client.Monitor(url=stand_in.url, run_id="r", settings=settings)
        # The newest restart names a file outside the job's checkpoints: refused.
        assert mon.resume_plan(ckpt, timeout=5) is None
        stand_in.actions.pop()
        plan = mon.resume_plan(ckpt, timeout=5)
        assert plan is not None
        assert (plan.id, plan.checkpoint_step, plan.resume_step, plan.resume_position,
                plan.skip, plan.lr_factor) == (1, 2, 3, 7, ((3, 5),), None)
        assert mon.rollback_plan() is None  # it is not a rollback to apply again
        mon.close()
    finally:
        stand_in.close()


def test_the_launcher_declaration_follows_torchrun_and_what_the_job_says():
    torchrun = {"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": "0",
                "TORCHELASTIC_MAX_RESTARTS": "2"}
    assert detect(torchrun, [])["restarts"] is True
    assert detect({**torchrun, "MONITOR_AGENT_RESTARTS": "0"}, [])["restarts"] is False
    # Saying 1 does not give torchrun restarts it has spent.
    spent = {**torchrun, "TORCHELASTIC_RESTART_COUNT": "2", "MONITOR_AGENT_RESTARTS": "1"}
    assert detect(spent, [])["restarts"] is False
    slurm = {"SLURM_JOB_ID": "9", "MONITOR_AGENT_RESTARTS": "1",
             "MONITOR_AGENT_NODES_RANGE": "2:4"}
    assert detect(slurm, [])["name"] == "slurm" and detect(slurm, [])["restarts"] is True
    assert (detect(slurm, [])["min_nodes"], detect(slurm, [])["max_nodes"]) == (2, 4)
    assert detect({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, [])["restarts"] is False


RESUMER = textwrap.dedent("""
    import sys
    import monitor_client
    url, spool, ckpt = sys.argv[1], sys.argv[2], sys.argv[3]
    settings = monitor_client.MonitorSettings(spool_dir=spool, linger=0.05, watchdog=False,
                                              gpu_probe=None, install_hooks=False)
    mon = monitor_client.Monitor(url=url, project="p", run_id="r", settings=settings)
    plan = mon.resume_plan(ckpt, timeout=5)
    print("resumed", plan.id if plan is not None else None, flush=True)
    mon.close()
    """)


def test_a_process_run_again_on_a_host_its_restart_left_out_leaves_at_resume(tmp_path):
    """A worker on the node a restart leaves out died of the others' exit before it read
    the decision (its collective broke first), and its elastic agent ran it again into the
    rendezvous. At resume it finds the restart that relaunched it leaves its own machine
    out: it leaves with 75, where the same relaunch on another machine resumes. Before,
    it resumed, and the node the plan left out trained on (tests/netcluster/test_heal.py
    on a loaded machine: the NaN node twice, node 1 exited 0)."""
    import socket

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "step-2.pt").write_bytes(b"weights")
    stand_in = StandIn()
    try:
        stand_in.publish(_restart(1, created_at=time.time() - 5,
                                  checkpoint_path=str(ckpt / "step-2.pt"), exclude=[{
                                      "node": 1, "host": socket.gethostname(),
                                      "sidecar": "s1", "ranks": [1], "why": "2nd incident"}]))
        # torchrun's worker environment; its parent is a shell, not an agent to SIGTERM.
        agent = {"TORCHELASTIC_RUN_ID": "j", "TORCHELASTIC_RESTART_COUNT": "1",
                 "TORCHELASTIC_MAX_RESTARTS": "3"}
        resumer = ["/bin/sh", "-c", '"$@"; exit $?', "sh", sys.executable, "-c", RESUMER,
                   stand_in.url]
        env = {**os.environ, "PYTHONPATH": str(REPO / "client"), **agent}
        left = subprocess.run([*resumer, str(tmp_path / "a"), str(ckpt)], env=env,
                              capture_output=True, text=True, timeout=120)
        assert left.returncode == 75, left.stderr
        assert "which it leaves out: it exits with 75 and its node leaves the job" in \
            left.stderr, left.stderr
        stand_in.actions[-1]["plan"]["exclude"][0]["host"] = "another-machine"
        stayed = subprocess.run([*resumer, str(tmp_path / "b"), str(ckpt)], env=env,
                                capture_output=True, text=True, timeout=120)
        assert (stayed.returncode, stayed.stdout.split()) == (0, ["resumed", "1"]), \
            stayed.stderr
    finally:
        stand_in.close()
