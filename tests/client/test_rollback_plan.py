"""The client's side of a rollback: the plan, ``checkpoint_saved``, ``rollback_plan()`` and
``rolled_back()`` against a loopback stand-in of the sidecar's wire contract (ingest answers
carrying actions, ``GET /v1/runs/{id}/actions``), and two real gloo ranks agreeing on one plan.

The end-to-end proofs against the real sidecar, whose rules decide the plan, are in
tests/e2e/test_rollback_loop.py.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from actions_stand_in import PLAN, StandIn
from actions_stand_in import rollback_action as _action

from monitor_client import Monitor, MonitorSettings
from monitor_client._rollback import PlanBook, RollbackPlan
from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def stand_in():
    server = StandIn()
    yield server
    server.close()


def test_plan_reads_the_contract_and_refuses_holes():
    plan = RollbackPlan.from_action(_action())
    assert plan is not None and plan.id == 5 and plan.rule == "RollBack" and plan.step == 35
    assert (plan.checkpoint_step, plan.resume_step, plan.skip_batches) == (20, 21, 20)
    assert [plan.lr_multiplier(s) for s in (20, 21, 30, 31)] == [1.0, 0.5, 0.5, 1.0]
    assert RollbackPlan.from_action(_action(lr_factor=None)).lr_multiplier(21) == 1.0
    assert plan.as_dict()["checkpoint_path"] == "/ckpt/step-20.pt"
    broken = _action()
    del broken["plan"]["checkpoint_path"]
    assert RollbackPlan.from_action(broken) is None
    assert RollbackPlan.from_action(_action(skip_to=10)) is None  # a window before C
    assert RollbackPlan.from_action({"id": 1, "action": "stop"}) is None


@pytest.mark.parametrize("plan", [
    {"lr_factor": float("nan")}, {"lr_factor": -1.0}, {"lr_factor": 0.0},
    {"lr_factor": 1e308}, {"lr_factor": "abc"}, {"lr_factor": True},
    {"skip": [[21, 10**15]]}, {"skip": [[40, 21]]}, {"checkpoint_step": "20"},
    {"skip_from": 2**60},
])
def test_a_plan_with_absurd_numbers_is_no_plan(plan):
    """Hostile input, part five: a plan whose LR factor is not a finite number in (0, 1],
    whose windows skip more than any run's data or are no windows, or whose counts are not
    JSON integers, is refused whole, from an action and from the resume file alike; the
    LR scaling a framework callback does never raises, whatever a plan says."""
    from monitor_client._resume import LrScale

    assert RollbackPlan.from_action(_action(**plan)) is None
    good = RollbackPlan.from_action(_action())
    assert good is not None
    assert RollbackPlan.from_dict({**good.as_dict(), **plan}) is None
    forged = RollbackPlan(**{**good.as_dict(), "skip": good.skip, "lr_factor": "abc"})

    class Optimizer:
        param_groups = [{"lr": 0.1}]

    scale = LrScale(forged)
    scale.apply(Optimizer(), step=good.resume_step)  # an LR factor of "abc": no raise
    assert Optimizer.param_groups[0]["lr"] == 0.1


def test_plan_book_newest_pending_and_honoured_plans_are_history():
    book = PlanBook()
    book.receive({"id": 2, "action": "stop"})
    assert book.newest() is None
    book.receive(_action(3))
    book.receive({**_action(4), "honoured_step": 21})  # a relaunch reading history back
    assert book.newest().id == 3
    book.receive(_action(6))
    assert book.newest().id == 6
    book.applied(6)
    assert book.newest().id == 3
    book.applied(3)
    assert book.newest() is None


def test_a_withdrawn_plan_is_no_order():
    # Plan 7's checkpoint turned suspect before anyone applied it; plan 8 replaced it.
    book = PlanBook()
    book.receive({**_action(7), "withdrawn_by": 8})
    assert book.newest() is None
    book.receive(_action(8))
    assert book.newest().id == 8


def _monitor(url: str, tmp_path: Path, run_id: str = "rb") -> Monitor:
    return Monitor(url=url, run_id=run_id,
                   settings=MonitorSettings(spool_dir=tmp_path / "spool", install_hooks=False,
                                            linger=0.01))


def test_checkpoint_saved_sends_the_contract_record_and_refuses_bad_paths(stand_in, tmp_path,
                                                                          caplog):
    mon = _monitor(stand_in.url, tmp_path)
    mon.checkpoint_saved(20, tmp_path / "step-20.pt", bytes=1234, tag="periodic")
    mon.checkpoint_saved(21, "x" * 5000)  # never raises into training: a warning
    assert "checkpoint path must be 1-4096 characters" in caplog.text
    mon.checkpoint_saved(22, "a\0b")
    assert mon.close(timeout=10)
    [record] = stand_in.of_kind("checkpoint")
    assert record == {"kind": "checkpoint", "run_id": "rb", "rank": 0, "attempt": mon.attempt,
                      "time": record["time"], "step": 20, "path": str(tmp_path / "step-20.pt"),
                      "bytes": 1234, "tag": "periodic"}


def test_plan_reaches_the_loop_and_rolled_back_opens_a_new_attempt(stand_in, tmp_path):
    mon = _monitor(stand_in.url, tmp_path)
    seen: list[dict] = []
    mon.on_action(seen.append)
    for step in range(1, 36):
        mon.log_step(step, loss=1.0)
        if step == 20:
            mon.checkpoint_saved(20, "/ckpt/step-20.pt")  # the plan's checkpoint
    assert mon.rollback_plan() is None
    stand_in.publish(_action())
    mon.log_step(36, loss=1.0)
    eventually(lambda: seen, timeout=15, what="the plan reached on_action")
    plan = mon.rollback_plan()
    assert plan == RollbackPlan.from_action(_action()) and seen[0]["plan"] == PLAN
    assert mon.rollback_plan() == plan  # until it is applied
    before = mon.attempt
    mon.rolled_back(plan)
    assert mon.rollback_plan() is None and mon.attempt != before
    assert mon._watchdog.header["attempt"] == mon.attempt  # a hang report is the new attempt's
    for step in range(plan.resume_step, plan.resume_step + 3):
        mon.log_step(step, loss=1.0)
    assert mon.close(timeout=10) and not mon.should_stop()
    replayed = [r for r in stand_in.records if r.get("attempt") == mon.attempt]
    assert [r["kind"] for r in replayed] == ["run", "step", "step", "step", "end"]
    assert [r.get("step") for r in replayed[1:]] == [21, 22, 23, 23]


def test_a_plan_for_a_checkpoint_this_process_never_reported_is_refused(stand_in, tmp_path,
                                                                      caplog):
    # Whoever holds the write token can put a checkpoint in the sidecar's ledger; the plan
    # that names it must not make the trainer load it.
    mon = _monitor(stand_in.url, tmp_path)
    for step in range(1, 36):
        mon.log_step(step, loss=1.0)
    mon.checkpoint_saved(20, "/ckpt/other-20.pt")  # its own save of step 20 is elsewhere
    stand_in.publish(_action())
    mon.log_step(36, loss=1.0)
    eventually(lambda: mon.actions(), timeout=15, what="the client holds the plan")
    assert [mon.rollback_plan() for _ in range(4)] == [None] * 4
    assert "names a checkpoint no rank of this job reported" in caplog.text
    mon.resumed_from(20, "/ckpt/step-20.pt")  # a relaunch that resumed from it may go back
    assert mon.rollback_plan() == RollbackPlan.from_action(_action())
    assert mon.close(timeout=10)
    held = stand_in.of_kind("agreement")
    assert [(h["action_id"], h["outcome"], h["rounds"]) for h in held] == [
        (5, "unreported", 1), (5, "unreported", 2), (5, "unreported", 4)]


def test_a_refused_plan_stops_the_run_rather_than_train_on_from_its_fault(stand_in,
                                                                         tmp_path):
    # The plan is never loaded, so the run would go on from the fault it was to leave (a
    # relaunched HF job trained NaN for its ~100 remaining steps): it stops, saying why.
    mon = _monitor(stand_in.url, tmp_path)
    for step in range(1, 36):
        mon.log_step(step, loss=1.0)
    mon.checkpoint_saved(30, "/ckpt/step-30.pt")  # not the plan's
    assert not mon.should_stop()
    stand_in.publish(_action())
    mon.log_step(36, loss=float("nan"))
    eventually(lambda: mon.actions(), timeout=15, what="the client holds the plan")
    assert mon.rollback_plan() is None
    assert mon.should_stop() and mon.should_stop()  # sticky
    assert mon.stop_reason() == ("rollback plan 5 names a checkpoint no process of this job "
                                 "saved or resumed from: not loaded; stopping, a human must "
                                 "look")
    assert mon.close(timeout=10)
    [end] = stand_in.of_kind("end")
    assert end["status"] == "stopped" and end["step"] == 36
    assert end["error"] == f"stopped at step 36: {mon.stop_reason()}"


def test_a_resumed_process_may_go_back_to_the_jobs_earlier_saves_it_inherited(stand_in,
                                                                            tmp_path):
    # Process 1 saved steps 10 and 20 and kept its chain with the save of step 20; process
    # 2 resumed from it. A plan to step 10 (a save of process 1, not the one process 2
    # resumed from) acts; a checkpoint in no process's chain is still refused.
    first = _monitor(stand_in.url, tmp_path, run_id="chain")
    first.log_step(10, loss=1.0)
    first.checkpoint_saved(10, "/ckpt/step-10.pt")
    first.log_step(20, loss=1.0)
    kept = first.job_checkpoints()  # saved with the checkpoint of step 20
    first.checkpoint_saved(20, "/ckpt/step-20.pt")
    assert kept == [[10, "/ckpt/step-10.pt"]]
    assert first.job_checkpoints() == [[10, "/ckpt/step-10.pt"], [20, "/ckpt/step-20.pt"]]
    first.close(timeout=10)
    second = _monitor(stand_in.url, tmp_path, run_id="chain")
    second.resumed_from(20, "/ckpt/step-20.pt", earlier=kept)
    assert second.job_checkpoints() == first.job_checkpoints()
    book = second._plans
    for number, (step, path) in enumerate(((10, "/ckpt/step-10.pt"), (20, "/ckpt/step-20.pt"),
                                           (10, "/elsewhere/step-10.pt")), start=1):
        book.receive(_action(number, checkpoint_step=step, checkpoint_path=path, skip_to=40))
    assert [book.vouches(book.get(n)) for n in (1, 2, 3)] == [True, True, False]
    assert book.inherit([[5, "/x"], ["6", "/y"], [7, ""], "junk", [8]]) == 1
    second.close(timeout=10)


def test_a_stop_instead_of_a_plan_still_stops(stand_in, tmp_path):
    mon = _monitor(stand_in.url, tmp_path)
    stand_in.publish({"id": 9, "action": "stop", "rule": "RollBack", "step": 35,
                      "message": "rollback budget spent (2 of 2): stop requested at step 35"})
    mon.log_step(1, loss=1.0)
    eventually(mon.should_stop, timeout=15, what="should_stop()")
    assert mon.rollback_plan() is None and "budget" in mon.stop_reason()
    mon.close(timeout=10)


def _gloo_env() -> dict[str, str]:
    """The environment of two gloo ranks on loopback, importing this checkout."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}


RANK_SCRIPT = """
import os, sys, time
import torch.distributed as dist
from monitor_client import Monitor, MonitorSettings

rank = int(sys.argv[1])
dist.init_process_group("gloo", rank=rank, world_size=2)
mon = Monitor(url=sys.argv[2], run_id="agree", settings=MonitorSettings(
    spool_dir=sys.argv[3] + f"/r{rank}", install_hooks=False, linger=0.01))
mon._sender.poll_interval = 3600.0  # rank 1 hears of the plan only by asking at agreement
if rank == 0:  # the plan's checkpoint: rank 0 saved it, rank 1 learns so at the agreement
    mon.checkpoint_saved(20, "/ckpt/step-20.pt")
for call in range(1, 200):
    mon.log_step(call, loss=1.0)
    if rank == 0 and call == 12:  # rank 0 has it in an ingest answer, rank 1 does not
        while mon.actions() == []:  # the rank's own process: bounded by communicate(timeout)
            time.sleep(0.01)
    plan = mon.rollback_plan(check_every=5)
    if plan is not None:
        print(f"rank {rank} plan {plan.id} at call {call} had={len(mon.actions())}", flush=True)
        mon.rolled_back(plan)
        break
dist.barrier()
mon.close(timeout=10)
"""


def test_two_ranks_get_the_same_plan_at_the_same_call(tmp_path):
    stand_in = StandIn(answer_ranks=(0,))
    stand_in.publish(_action())
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    env = _gloo_env()
    try:
        procs = [subprocess.Popen([sys.executable, str(script), str(r), stand_in.url,
                                   str(tmp_path)], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for r in (0, 1)]
        outs = [p.communicate(timeout=120) for p in procs]
    finally:
        stand_in.close()
    assert all(p.returncode == 0 for p in procs), outs
    lines = [out.strip().splitlines()[-1] for out, _ in outs]
    # Rank 0 has the plan by call 12 (from an ingest answer: by call 10 already when its
    # sender was quick); the next agreement (every 5 calls) hands it to both at one call,
    # rank 1 fetching it from the actions endpoint (its poll was switched off).
    call = lines[0].split(" at call ")[1].split()[0]
    assert call in ("10", "15"), lines
    assert lines == [f"rank 0 plan 5 at call {call} had=1", f"rank 1 plan 5 at call {call} had=1"]
    assert stand_in.gets >= 1


HELD_SCRIPT = """
import sys, time
import torch.distributed as dist
from monitor_client import Monitor, MonitorSettings

rank, mode, flag = int(sys.argv[1]), sys.argv[4], sys.argv[5]
dist.init_process_group("gloo", rank=rank, world_size=2)
mon = Monitor(url=sys.argv[2], run_id="held", settings=MonitorSettings(
    spool_dir=sys.argv[3] + f"/r{rank}", install_hooks=False, linger=0.01))
mon._sender.poll_interval = 3600.0  # each rank hears only from its own stand-in, when asked
if rank == 0 and mode != "unreported":  # rank 0 saved the plan's checkpoint
    mon.checkpoint_saved(20, "/ckpt/step-20.pt")
for call in range(1, 400):
    mon.log_step(call, loss=1.0)
    if call == 38 and rank == 0:
        open(flag, "w").close()  # the test now gives rank 1's sidecar the action too
    acted = mon.should_stop(check_every=5) if mode == "stop" else \\
        mon.rollback_plan(check_every=5)
    if acted:
        print(f"rank {rank} acts at call {call}", flush=True)
        break
    time.sleep(0.005)  # a training step's pace
dist.barrier()
mon.close(timeout=10)
"""


def _two_ranks(tmp_path: Path, stand_ins: list[StandIn], mode: str,
               later: dict | None) -> list[str]:
    """Two gloo ranks, each on its own stand-in sidecar; once rank 0 reaches call 38 the
    test publishes ``later`` to rank 1's stand-in. Returns each rank's last line."""
    script, flag = tmp_path / "held.py", tmp_path / "flag"
    script.write_text(HELD_SCRIPT)
    env = _gloo_env()
    procs = [subprocess.Popen([sys.executable, str(script), str(r), stand_ins[r].url,
                               str(tmp_path), mode, str(flag)], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in (0, 1)]
    if later is not None:
        eventually(flag.exists, timeout=60, what=f"the ranks reached {flag.name}")
        stand_ins[1].publish(later)
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [(out.strip().splitlines() or ["(none)"])[-1] for out, _ in outs]


def test_a_rank_whose_sidecar_lacks_the_plan_holds_every_rank_back_and_says_so(tmp_path):
    stand_ins = [StandIn(answer_ranks=(0,)), StandIn(answer_ranks=())]
    stand_ins[0].publish(_action())
    try:
        lines = _two_ranks(tmp_path, stand_ins, "plan", later=_action())
        held = stand_ins[1].of_kind("agreement")
        assert not stand_ins[0].of_kind("agreement")  # rank 0 had it: not its doing
    finally:
        for s in stand_ins:
            s.close()
    # Neither rank acted while rank 1 lacked it; both act at the same call once it has it.
    calls = {line.split()[-1] for line in lines}
    assert len(calls) == 1 and int(calls.pop()) >= 40, lines
    assert held and held[0]["action_id"] == 5 and held[0]["outcome"] == "missing"
    assert [h["rounds"] for h in held][:2] == [1, 2] and held[0]["action"] == "rollback"


def test_two_contents_under_one_plan_id_are_never_acted_on(tmp_path):
    stand_ins = [StandIn(answer_ranks=(0,)), StandIn(answer_ranks=(1,))]
    stand_ins[0].publish(_action())
    stand_ins[1].publish(_action(skip_to=60))  # another sidecar's "plan 5"
    try:
        lines = _two_ranks(tmp_path, stand_ins, "plan", later=None)
        held = [*stand_ins[0].of_kind("agreement"), *stand_ins[1].of_kind("agreement")]
    finally:
        for s in stand_ins:
            s.close()
    assert lines == ["(none)", "(none)"]  # a split job is worse than no rollback
    assert {(h["rank"], h["outcome"]) for h in held} == {(0, "mismatch"), (1, "mismatch")}


def test_a_plan_no_rank_reported_the_checkpoint_of_is_acted_on_by_none(tmp_path):
    stand_ins = [StandIn(answer_ranks=(0,)), StandIn(answer_ranks=(1,))]
    for stand_in in stand_ins:
        stand_in.publish(_action())  # both sidecars serve it; no rank saved step 20
    try:
        lines = _two_ranks(tmp_path, stand_ins, "unreported", later=None)
        held = [*stand_ins[0].of_kind("agreement"), *stand_ins[1].of_kind("agreement")]
    finally:
        for s in stand_ins:
            s.close()
    assert lines == ["(none)", "(none)"]
    assert {(h["rank"], h["outcome"]) for h in held} == {(0, "unreported"), (1, "unreported")}


def test_a_stop_is_honoured_by_every_rank_at_the_same_call_or_by_none(tmp_path):
    stop = {"id": 9, "action": "stop", "rule": "StopOnNaN", "step": 30,
            "message": "stop requested at step 30 by rule StopOnNaN"}
    stand_ins = [StandIn(answer_ranks=(0,)), StandIn(answer_ranks=())]
    stand_ins[0].publish(stop)
    try:
        lines = _two_ranks(tmp_path, stand_ins, "stop", later=stop)
        held = stand_ins[1].of_kind("agreement")
        ends = [r["status"] for s in stand_ins for r in s.of_kind("end")]
    finally:
        for s in stand_ins:
            s.close()
    calls = {line.split()[-1] for line in lines}
    assert len(calls) == 1 and int(calls.pop()) >= 40, lines
    assert held and held[0]["action"] == "stop" and held[0]["outcome"] == "missing"
    assert ends == ["stopped", "stopped"]
