"""The hang watchdog (client/monitor_client/_watchdog.py): one hang record while the
training thread is blocked in C code, through the real Monitor and sender to a loopback
endpoint that validates with the sidecar's own schema; its size bound with 60 threads."""

from __future__ import annotations

import json
import os
import threading
import time

import pytest
import torch
from training_steps import log_steps

import monitor_client
from monitor_agent.records.schemas import parse_record
from monitor_client._watchdog import HANG_STACK_BYTES, Watchdog
from monitor_client.settings import MonitorSettings
from tests.eventually import eventually


def blocked_in_c(fd: int) -> bytes:
    return os.read(fd, 1)  # a C call that releases the GIL, as a collective's wait does


def test_a_training_thread_blocked_in_c_code_sends_one_hang_record(receiver, tmp_path):
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = monitor_client.Monitor(url=receiver.url, run_id="wd", settings=MonitorSettings(
        linger=0.0, watchdog_floor=0.5, spool_dir=str(tmp_path), gpu_probe=None))
    mon.watch(model, opt)
    log_steps(mon, model, opt, range(1, 7), batch=2)
    read_end, write_end = os.pipe()
    # Released by another thread once the hang record has arrived: the trainer itself is
    # blocked in os.read the whole time, holding no GIL.
    releaser = threading.Thread(target=lambda: (
        eventually(lambda: receiver.of_kind("hang"), timeout=60, what="the hang record"),
        os.write(write_end, b"x")), daemon=True)
    releaser.start()
    blocked_in_c(read_end)
    releaser.join()
    mon.log_step(7, loss=1.0)
    mon.close()
    hangs = receiver.of_kind("hang")
    assert len(hangs) == 1
    hang = hangs[0]
    assert hang["step"] == 6 and hang["rank"] == 0 and hang["phase"] == "data"
    assert hang["stuck_seconds"] > hang["limit_seconds"] >= 0.5
    training = hang["threads"][0]
    assert training["training"] is True
    assert training["frames"][-1]["function"] == "blocked_in_c"
    assert training["frames"][-1]["file"].endswith("test_watchdog.py")
    assert training["frames"][-1]["user"] is True
    assert all(not t.get("training") for t in hang["threads"][1:])
    run = receiver.of_kind("run")[0]
    assert run["watchdog"] == {"floor_seconds": 0.5, "factor": 5.0, "warmup_steps": 5}
    assert [r["step"] for r in receiver.of_kind("step")] == list(range(1, 8))


def test_the_phase_is_what_the_hooks_saw_last(receiver, tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = monitor_client.Monitor(url=receiver.url, run_id="wd-phase", settings=MonitorSettings(
        linger=0.0, watchdog_floor=0.5, spool_dir=str(tmp_path), gpu_probe=None))
    mon.watch(model, opt)
    mon.log_step(1, loss=1.0)
    assert mon._phase.phase == "data"
    # no hook on the model for the phase (forward and backward are read from the stack)
    assert not model._forward_hooks and not model._forward_pre_hooks
    seen = []
    opt.register_step_pre_hook(lambda *_: seen.append(mon._phase.phase))
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    assert seen == ["optimizer"] and mon._phase.phase == "data"
    mon.close()


class _Blocking(torch.nn.Module):
    """A module whose forward, or whose backward, waits for an event."""

    def __init__(self, where: str, release: threading.Event) -> None:
        super().__init__()
        self.linear, self.where, self.release = torch.nn.Linear(2, 1), where, release

    def forward(self, x):
        if self.where == "forward":
            self.release.wait()
        out = self.linear(x)
        return _WaitInBackward.apply(out, self.release) if self.where == "backward" else out


class _WaitInBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, release):
        ctx.release = release
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        ctx.release.wait()
        return grad, None


@pytest.mark.parametrize("where", ["forward", "backward"])
def test_a_hang_in_forward_or_backward_says_so_from_the_stack(where):
    """No hook runs on the model: the phase of a hang in a forward or a backward comes
    from the training thread's stack when the watchdog reports it."""
    release = threading.Event()
    model = _Blocking(where, release)
    sent: list[dict] = []
    dog = Watchdog(0.05, sent.append, {"run_id": "r", "rank": 0}, threaded=False)
    dog.beat(3)

    def train():
        model(torch.ones(1, 2)).sum().backward()

    worker = threading.Thread(target=train)
    worker.start()
    dog.training_ident = worker.ident
    try:
        def stuck_there():
            assert dog.check(time.monotonic() + 1.0) or sent
            assert sent[-1]["phase"] == where, sent[-1]["phase"]
            return sent[-1]

        eventually(lambda: _inside(dog, where), timeout=30, what=f"the thread in {where}")
        record = stuck_there()
    finally:
        release.set()
        worker.join()
    assert record["step"] == 3


def _inside(dog: Watchdog, where: str) -> bool:
    frames = dog.stacks()[0][0]["frames"]
    names = [f["function"] for f in frames]
    assert ("forward" if where == "forward" else "backward") in names[-3:], names[-4:]
    return True


def test_off_means_no_thread_and_no_declaration(receiver, tmp_path):
    before = {t.name for t in threading.enumerate()}
    mon = monitor_client.Monitor(url=receiver.url, run_id="wd-off", settings=MonitorSettings(
        linger=0.0, watchdog=False, spool_dir=str(tmp_path), gpu_probe=None))
    mon.log_step(1, loss=1.0)
    assert "monitor_client-watchdog" not in {t.name for t in threading.enumerate()} - before
    mon.close()
    assert receiver.of_kind("run")[0].get("watchdog") is None


def test_a_floor_that_is_not_positive_is_refused():
    with pytest.raises(ValueError, match="watchdog_floor must be > 0"):
        MonitorSettings(watchdog_floor=0)


def _deep(depth: int, ready: threading.Barrier, stop: threading.Event) -> None:
    if depth:
        _deep(depth - 1, ready, stop)
        return
    ready.wait()
    stop.wait()


def test_sixty_threads_fit_the_documented_cap_training_thread_first():
    stop = threading.Event()
    ready = threading.Barrier(61)
    threads = [threading.Thread(target=_deep, args=(80, ready, stop), name=f"worker-{i:02d}",
                                daemon=True) for i in range(60)]
    for t in threads:
        t.start()
    ready.wait()
    try:
        dog = Watchdog(floor=1.0, send=lambda r: None, header={"run_id": "r", "rank": 0},
                       threaded=False)
        dog.beat(3)  # this thread is the training thread; the record is made on another
        made: list[dict] = []
        reader = threading.Thread(target=lambda: made.append(
            dog.record(stuck=10.0, limit=5.0, now=time.monotonic())))
        reader.start()
        reader.join()
        record = made[0]
    finally:
        stop.set()
    size = len(json.dumps(record["threads"]))
    assert size <= HANG_STACK_BYTES
    assert record["threads"][0]["training"] is True
    assert len(record["threads"]) + record["threads_omitted"] >= 61
    assert all(len(t["frames"]) <= 48 for t in record["threads"])
    assert parse_record(record).kind == "hang"  # the sidecar accepts what the client bounds


def test_a_failing_send_never_reaches_training():
    def broken(record):
        raise RuntimeError("sender gone")

    dog = Watchdog(floor=0.05, send=broken, header={"run_id": "r", "rank": 0})
    dog.beat(1)
    eventually(lambda: dog.errors >= 1, timeout=30, what="the watchdog's error counted")
    dog.stop()


def test_code_without_a_file_in_the_scripts_namespace_is_the_scripts_own():
    """``python -c`` and ``exec`` of a script's text run as ``<string>``: the frames of
    code run in ``__main__`` (or a namespace no module owns) are marked ``user``; code a
    library made in its own module's namespace (a dataclass's ``__init__``) is not."""
    import string

    released = threading.Event()
    script: dict = {"__name__": "__main__"}
    exec(compile("def wait_here(ev):\n    ev.wait()\n", "<string>", "exec"), script)
    exec(compile("def library_wait(ev):\n    ev.wait()\n", "<string>", "exec"), vars(string))
    try:
        dog = Watchdog(60.0, lambda r: None, {"run_id": "r", "rank": 0}, threaded=False)
        for target, mine in ((script["wait_here"], True), (string.library_wait, False)):
            worker = threading.Thread(target=target, args=(released,))
            worker.start()
            dog.training_ident = worker.ident
            frames = eventually(lambda: _waiting(dog), timeout=30, what="the thread waiting")
            released.set()
            worker.join()
            released.clear()
            # threading.py's waits are innermost: below them, the code that called them
            caller = next(f for f in reversed(frames) if f["file"] != "threading.py")
            assert (caller["file"], caller["function"], caller["user"]) == (
                "<string>", target.__name__, mine)
            assert frames[-1]["file"] == "threading.py" and frames[-1]["user"] is False
    finally:
        del string.library_wait


def _waiting(dog: Watchdog) -> list[dict]:
    threads, _ = dog.stacks()
    frames = threads[0]["frames"]
    assert threads[0].get("training") and frames[-1]["function"] == "wait", frames[-3:]
    return frames


def test_a_hang_reads_eval_only_while_every_watched_model_evaluates():
    """A policy that trains beside a target network kept in eval mode is training: its hang
    is restarted for; every watched model in eval mode is an evaluation, never restarted."""
    from monitor_client._phase import PhaseTracker

    policy, target = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    tracker = PhaseTracker()
    tracker.attach([], [policy, target])
    target.eval()
    assert tracker.evaluating() is None
    policy.eval()
    assert tracker.evaluating() == "eval"
    policy.train()
    assert tracker.evaluating() is None


def test_a_stuck_process_hurries_its_polls_and_its_run_record_names_it(receiver, tmp_path):
    """Once its watchdog reported it stuck, the sender asks for the run's actions every
    second (a restart reaches a stuck rank only by a poll: _sender.py ``HURRIED_POLL``),
    until it steps again; and its run record names its process, as the sidecar checks it
    before ending a stopped rank (docs/format.md ``process``)."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    mon = monitor_client.Monitor(url=receiver.url, run_id="wd-hurry", settings=MonitorSettings(
        linger=0.0, watchdog_floor=0.5, spool_dir=str(tmp_path), gpu_probe=None))
    mon.watch(model, opt)
    log_steps(mon, model, opt, range(1, 7), batch=2)
    sender = mon._sender
    assert sender is not None and sender.hurry is not None and not sender.hurry()
    eventually(lambda: receiver.of_kind("hang"), timeout=60, what="the hang record")
    assert sender.hurry()
    mon.log_step(7, loss=1.0)
    assert not sender.hurry()
    mon.close()
    process = parse_record(receiver.of_kind("run")[0]).process
    assert process is not None and process.pid == os.getpid()
    with open(f"/proc/{os.getpid()}/stat", "rb") as stat:
        assert process.start == int(stat.read().rsplit(b")", 1)[1].split()[19])
    with open("/proc/sys/kernel/random/boot_id") as boot:
        assert process.boot == boot.read().strip()
