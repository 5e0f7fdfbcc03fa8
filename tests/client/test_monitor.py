import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from monitor_agent.records.schemas import parse_record
from monitor_client import Monitor, MonitorSettings, WatchSettings

REPO = Path(__file__).resolve().parents[2]


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def _train(mon, steps=12, seed=0, accum=1, eval_every=5, clip=None):
    """A plain loop with gradient accumulation; returns the model's final parameters."""
    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    if mon is not None:
        mon.watch(model, opt, grad_clip=clip, settings=WatchSettings(layer_stats_every=4))
    gen = torch.Generator().manual_seed(seed)
    for step in range(1, steps + 1):
        for _ in range(accum):
            x = torch.randn(16, 8, generator=gen)
            loss = model(x).pow(2).mean() / accum
            loss.backward()
        opt.step()
        opt.zero_grad()
        if mon is not None:
            mon.log_step(step, loss=loss.detach() * accum, tokens=16 * accum, samples=16)
            if step % eval_every == 0:
                mon.log_eval(step, val_loss=0.5, metrics={"accuracy": 0.25})
    return [p.detach().clone() for p in model.parameters()]


def _mon(url, tmp_path, run_id, labels=None, **settings):
    settings.setdefault("linger", 0.02)
    return Monitor(url=url, project="unit test", config={"lr": 1e-2}, run_id=run_id,
                   labels=labels, settings=MonitorSettings(spool_dir=tmp_path, install_hooks=False,
                                                           timeout=(0.5, 5.0), **settings))


def test_plain_loop_against_the_real_sidecar(sidecar, tmp_path):
    mon = _mon(sidecar.url, tmp_path, run_id="plain-1", labels={"team-name": "x"})
    _train(mon, steps=12, accum=2)
    assert mon.close(timeout=20)
    records = sidecar.records("plain-1", since_step=0)
    steps = [r for r in records if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 13))
    assert [r["kind"] for r in records].count("eval") == 2
    assert [r["kind"] for r in records].count("end") == 1
    first = steps[0]
    for key in ("loss", "lr", "grad_norm", "param_norm", "update_norm", "step_time",
                "tokens_per_second", "memory", "layers"):
        assert first.get(key) is not None, key
    assert first["tokens"] == 32 and first["memory"]["allocated_bytes"] > 0
    assert [("layers" in r and r["layers"] is not None) for r in steps] == [
        s % 4 == 1 for s in range(1, 13)]
    assert set(steps[0]["layers"]) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    run = sidecar.records("plain-1", since_step=-1)[0]
    assert run["kind"] == "run" and run["labels"]["project"] == "unit test"
    assert run["labels"]["team_name"] == "x" and run["model"]["n_params"] == 212
    assert mon.counters().dropped == 0 and mon.counters().rejected == 0


def test_sidecar_killed_mid_run_loses_no_step(sidecar, tmp_path):
    mon = _mon(sidecar.url, tmp_path, run_id="kill-1")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, opt)
    for step in range(1, 41):
        if step == 15:
            assert mon.flush(timeout=10)
            sidecar.kill()
        if step == 30:
            sidecar.start()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=float(step))
    assert mon.close(timeout=20)
    steps = [r for r in sidecar.records("kill-1", since_step=0) if r["kind"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, 41))
    assert [r["loss"] for r in steps] == [float(s) for s in range(1, 41)]
    assert mon.counters().spooled > 0


def test_absent_sidecar_leaves_training_unchanged_and_spool_bounded(stopped_receiver,
                                                                     tmp_path):
    reference = _train(None, steps=30)
    mon = _mon(stopped_receiver.url, tmp_path / "a", run_id="absent-1", spool_max_bytes=20_000)
    monitored = _train(mon, steps=30)
    for a, b in zip(reference, monitored, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # bit-identical training
    mon.flush(timeout=0.5)
    # Step records stop at the bound; run/eval/end ones are kept past it by design (_spool.py),
    # so the spool may end a few eval records (~200 bytes each) over it.
    assert mon._sender.spool.pending_bytes <= 20_000 + 6 * 200 and mon.counters().dropped > 0
    mon.close(timeout=0.2)


def test_absent_sidecar_then_started_gets_everything(stopped_receiver, tmp_path):
    mon = _mon(stopped_receiver.url, tmp_path, run_id="late-1")
    _train(mon, steps=20)
    assert not mon.flush(timeout=0.3)
    stopped_receiver.start()
    assert mon.close(timeout=20)
    assert [r["step"] for r in stopped_receiver.of_kind("step")] == list(range(1, 21))
    assert stopped_receiver.of_kind("end")[0]["status"] == "completed"


def test_every_record_follows_the_wire_schema(receiver, tmp_path):
    mon = _mon(receiver.url, tmp_path, run_id="schema-1")
    _train(mon, steps=6, clip=0.01)
    mon.close(timeout=10)
    assert mon.counters().rejected == 0
    for obj in receiver.records:
        parse_record(obj)
    steps = receiver.of_kind("step")
    assert len(steps) == 6 and all(r["clip_threshold"] == 0.01 for r in steps), steps


def test_nan_loss_and_gradients_reach_the_sidecar_as_nan(receiver, tmp_path):
    mon = _mon(receiver.url, tmp_path, run_id="nan-1")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon.watch(model, opt, settings=WatchSettings(layer_stats_every=1))
    loss = model(torch.randn(4, 8)).sum() * float("nan")
    loss.backward()
    opt.step()
    mon.log_step(1, loss=loss)
    mon.close(timeout=10)
    step = receiver.of_kind("step")[0]
    assert step["loss"] == "NaN" and step["grad_norm"] == "NaN"
    assert step["layers"]["0.weight"]["grad_norm"] == "NaN"
    assert math.isnan(parse_record(step).loss)


def test_grad_scaler_overflow_is_a_skipped_step_with_its_loss_scale(receiver, tmp_path):
    mon = _mon(receiver.url, tmp_path, run_id="amp-1")
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    mon.watch(model, opt, scaler=scaler)
    for step, factor in ((1, 1.0), (2, float("inf")), (3, 1.0)):
        opt.zero_grad()  # at the top: the skipped step's gradients are still there to read
        loss = model(torch.randn(4, 8)).pow(2).mean() * factor
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        mon.log_step(step, loss=loss.detach())
    mon.close(timeout=10)
    steps = receiver.of_kind("step")
    assert [r.get("skipped") for r in steps] == [None, True, None]
    assert steps[1]["grad_norm"] in ("Infinity", "NaN")
    assert [r["loss_scale"] for r in steps] == [1024.0, 512.0, 512.0]


def test_bad_arguments_warn_and_never_raise(receiver, tmp_path, caplog):
    mon = _mon(receiver.url, tmp_path, run_id="bad-1")
    mon.log_step("not a number", loss="nope")
    mon.log_step(1, loss=object())
    mon.log_step(2, loss=0.5)
    mon.close(timeout=10)
    # a step without a number is dropped; a loss that is not a number is, not its step
    assert [(r["step"], r["loss"]) for r in receiver.of_kind("step")] == [(1, None), (2, 0.5)]
    assert "log_step failed" in caplog.text
    assert "log_step(loss=<object object" in caplog.text and "not a number" in caplog.text


def test_a_watched_loop_whose_loss_is_not_a_number_still_sends_every_step(receiver, tmp_path,
                                                                         caplog):
    """With a model watched, a loss of the wrong type (a dict of losses, a list, text)
    dropped the whole step, while the warning said it went without the loss; a one-element
    NumPy array (``.numpy()`` of a loss of shape (1,)) is a number."""
    import numpy as np

    mon = _mon(receiver.url, tmp_path, run_id="bad-watched")
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    mon.watch(model, opt)
    losses = [{"g": 1.0}, [1.0], "nope", np.array([1.5]), np.float32(2.5)]
    for step, loss in enumerate(losses, 1):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(step, loss=loss)
    mon.close(timeout=10)
    assert [(r["step"], r["loss"]) for r in receiver.of_kind("step")] == [
        (1, None), (2, None), (3, None), (4, 1.5), (5, 2.5)]
    assert "log_step failed" not in caplog.text


def test_a_loop_that_dies_in_its_thread_ends_the_run_failed_and_another_threads_death_not(
        receiver, tmp_path):
    script = textwrap.dedent("""
        import sys, threading, torch
        from monitor_client import Monitor, MonitorSettings
        mon = Monitor(url=sys.argv[1], run_id=sys.argv[2],
                      settings=MonitorSettings(spool_dir=sys.argv[3], linger=0.02))
        def logger():
            raise OSError("log disk full")  # not the loop: the run goes on
        def train():
            for step in range(1, 4):
                mon.log_step(step, loss=1.0)
            raise RuntimeError("bad batch in the training thread")
        for target in (logger, train):
            thread = threading.Thread(target=target)
            thread.start()
            thread.join()
        mon.close(timeout=10)
    """)
    env = {"PYTHONPATH": f"{REPO / 'client'}:{REPO}", "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script, receiver.url, "thread-loop",
                           str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "OSError: log disk full" in proc.stderr  # threading's own report, still printed
    [end] = receiver.of_kind("end")
    assert (end["status"], end["error"]) == ("failed", "RuntimeError: bad batch in the training "
                                                       "thread")


def test_rank0_only_makes_other_ranks_silent(receiver, tmp_path):
    mon = _mon(receiver.url, tmp_path, run_id="r0", rank=1, world_size=2, rank0_only=True)
    _train(mon, steps=3)
    mon.close()
    assert receiver.records == [] and mon.counters() is None


def test_every_rank_sends_by_default_with_its_rank(receiver, tmp_path):
    for rank in (0, 1):
        mon = _mon(receiver.url, tmp_path / str(rank), run_id="ddp-1", rank=rank, world_size=2)
        _train(mon, steps=3)
        mon.close(timeout=10)
    assert sorted((r["rank"], r["step"]) for r in receiver.of_kind("step")) == [
        (rank, s) for rank in (0, 1) for s in (1, 2, 3)]


def test_uncaught_exception_ends_the_run_failed(receiver, tmp_path):
    script = textwrap.dedent(f"""
        import torch
        from monitor_client import Monitor, MonitorSettings
        mon = Monitor(url={receiver.url!r}, run_id="crash-1",
                      settings=MonitorSettings(spool_dir={str(tmp_path)!r}, linger=0.02))
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon.watch(model, opt)
        mon.log_step(1, loss=1.0)
        raise ValueError("boom in the training loop")
    """)
    env = {"PYTHONPATH": f"{REPO / 'client'}:{REPO}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == 1 and "boom in the training loop" in proc.stderr
    end = receiver.of_kind("end")[0]
    assert end["status"] == "failed" and "ValueError: boom" in end["error"]
    assert end["step"] == 1


@pytest.mark.parametrize(("call", "status", "code", "outcome"), [
    ("sys.exit", "3", 3, "failed"), ("sys.exit", "'diverged at step 1'", 1, "failed"),
    ("sys.exit", "0", 0, "completed"), ("sys.exit", "", 0, "completed"),
    ("sys.exit", "75", 75, "stopped"), ("exit", "2", 2, "failed"), ("quit", "", 0, "completed")])
def test_a_scripts_own_sys_exit_says_whether_it_failed(receiver, tmp_path, call, status, code,
                                                       outcome):
    """``sys.exit(1)`` or the ``exit(1)`` builtin (a script giving up on a bad loss,
    argparse's 2) is the script saying it failed; Python hands ``SystemExit`` to no hook,
    so the run ended ``completed``."""
    run_id = f"exit-{call}-{code}-{outcome}-{len(status)}"
    script = textwrap.dedent(f"""
        import sys
        from monitor_client import Monitor, MonitorSettings
        mon = Monitor(url={receiver.url!r}, run_id={run_id!r},
                      settings=MonitorSettings(spool_dir={str(tmp_path)!r}, linger=0.02))
        mon.log_step(1, loss=1.0)
        {call}({status})
    """)
    env = {"PYTHONPATH": f"{REPO / 'client'}:{REPO}", "PATH": "/usr/bin:/bin"}
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=60)
    assert proc.returncode == code, proc.stderr
    end, = [r for r in receiver.of_kind("end") if r["run_id"] == run_id]
    assert end["status"] == outcome
    if outcome == "failed":
        assert end["error"] == f"SystemExit: {eval(status)}"
    if code == 75:  # the status that asks the launcher for a relaunch: not a crash
        assert end["error"].startswith("SystemExit: 75 (a relaunch")


def test_close_gives_sys_exit_back(tmp_path):
    import builtins

    before, exit_before = sys.exit, builtins.exit
    mon = Monitor(url="http://127.0.0.1:9", run_id="exit-back",
                  settings=MonitorSettings(spool_dir=tmp_path))
    assert sys.exit is not before and builtins.exit is not exit_before
    assert repr(builtins.exit) == repr(exit_before)  # the REPL's hint stays as it was
    mon.close(timeout=0.1)
    assert sys.exit is before and builtins.exit is exit_before


def test_eval_and_checkpoint_carry_the_seconds_since_the_previous_loop_record(receiver,
                                                                              tmp_path):
    """An eval's and a save's ``seconds`` (the goodput ledger's) is the time since the
    previous ``log_step``/``log_eval``/``checkpoint_saved``: the evaluation or save that ran
    in between; ``log_step``'s step_time still spans everything since the previous step."""
    import time

    mon = _mon(receiver.url, tmp_path, run_id="seconds-1")
    mon.checkpoint_saved(0, tmp_path / "init.pt")  # no loop record before it: not measured
    mon.log_step(1, loss=1.0)
    time.sleep(0.2)  # the evaluation
    mon.log_eval(1, val_loss=0.5)
    time.sleep(0.1)  # the save
    mon.checkpoint_saved(1, tmp_path / "step-1.pt")
    mon.log_step(2, loss=1.0)
    time.sleep(0.05)  # time the script's own figure overrides
    mon.log_eval(2, val_loss=0.5, seconds=7.5)  # the script's own measure wins
    mon.checkpoint_saved(2, tmp_path / "step-2.pt", seconds=0)
    assert mon.close(timeout=10)
    evals = {r["step"]: r for r in receiver.of_kind("eval")}
    saves = {r["step"]: r for r in receiver.of_kind("checkpoint")}
    steps = {r["step"]: r for r in receiver.of_kind("step")}
    assert "seconds" not in saves[0]
    assert evals[1]["seconds"] >= 0.2 and saves[1]["seconds"] >= 0.1
    # each measured from the loop's previous record: two spans of step 2's, not overlapping
    assert evals[1]["seconds"] + saves[1]["seconds"] <= steps[2]["step_time"]
    assert steps[2]["step_time"] >= 0.3  # unchanged: the eval and the save are in it
    assert evals[2]["seconds"] == 7.5 and saves[2]["seconds"] == 0.0
    for obj in receiver.records:
        parse_record(obj)


def test_a_save_right_after_a_slow_log_step_is_timed_without_the_log_steps_own_time(
        receiver, tmp_path):
    """On a loaded machine ``log_step`` itself can take a while; a save called right after
    it is timed from its return, so the checkpoint bucket holds the save alone (a fresh-
    clone CI booked 50 ms of monitoring per save as checkpoint time)."""
    import time

    class SlowLoss:  # a loss whose conversion takes 0.3 s: a slow log_step
        def __float__(self) -> float:
            time.sleep(0.3)
            return 1.0

    mon = _mon(receiver.url, tmp_path, run_id="seconds-own")
    mon.log_step(1, loss=1.0)
    mon.log_step(2, loss=SlowLoss())
    mon.checkpoint_saved(2, tmp_path / "step-2.pt")
    mon.log_eval(2, val_loss=SlowLoss())  # its own slow work is the eval's (log_eval syncs)
    mon.checkpoint_saved(3, tmp_path / "step-3.pt")
    assert mon.close(timeout=10)
    saves = {r["step"]: r for r in receiver.of_kind("checkpoint")}
    evals = {r["step"]: r for r in receiver.of_kind("eval")}
    steps = {r["step"]: r for r in receiver.of_kind("step")}
    assert steps[2]["loss"] == 1.0
    assert saves[2]["seconds"] < 0.3 and saves[3]["seconds"] < 0.3, saves
    assert evals[2]["seconds"] < 0.3, evals


def test_a_bad_seconds_is_left_out_with_a_warning_and_the_record_still_sent(receiver, tmp_path,
                                                                             caplog):
    mon = _mon(receiver.url, tmp_path, run_id="seconds-bad")
    mon.log_step(1, loss=1.0)
    mon.log_eval(1, val_loss=0.5, seconds=-1.0)
    mon.checkpoint_saved(1, tmp_path / "a.pt", seconds=float("nan"))
    mon.log_eval(2, val_loss=0.5, seconds="soon")
    assert mon.close(timeout=10)
    assert [r["step"] for r in receiver.of_kind("eval")] == [1, 2]
    assert [r["step"] for r in receiver.of_kind("checkpoint")] == [1]
    assert not any("seconds" in r for r in receiver.records if r["kind"] != "run")
    assert "is not a finite number >= 0" in caplog.text


def test_rolled_back_restarts_the_loop_clock(receiver, tmp_path):
    """After a rollback's reload, an eval right away times the eval, not the reload."""
    import time

    from monitor_client._rollback import RollbackPlan

    mon = _mon(receiver.url, tmp_path, run_id="seconds-rb")
    mon.log_step(10, loss=1.0)
    time.sleep(0.2)  # the reload
    reloaded = time.time()
    plan = RollbackPlan.from_action({
        "id": 1, "action": "rollback", "step": 10, "plan": {
            "checkpoint_step": 5, "checkpoint_path": "/c/5.pt", "skip_from": 6, "skip_to": 9}})
    assert plan is not None
    mon.rolled_back(plan)
    mon.log_eval(5, val_loss=0.5)
    assert mon.close(timeout=10)
    [ev] = receiver.of_kind("eval")
    # From the rollback on, not from step 10 (then it would hold the reload): within the
    # time since the reload ended, on the run's own clocks (0.01 s: time.time() against
    # the monotonic clock the client measures with).
    assert ev["seconds"] <= ev["time"] - reloaded + 0.01, (ev, reloaded)
