"""SIGTERM (a scheduler's preemption, time limit or cancel) ends the run ``stopped`` with
every step it logged, and the process exits 143 as one killed by it; a process the client
must leave alone still dies of it. Real subprocesses sending to the loopback receiver."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
STEPS = 30

# {before}: code run before the Monitor exists; {stuck}: how the main thread waits once it
# logged every step (for SIGTERM, which the test sends once step STEPS is received).
SCRIPT = """
import os, signal, sys, time, torch
from monitor_client import Monitor, MonitorSettings
{before}
mon = Monitor(url=sys.argv[1], run_id=sys.argv[2],
              settings=MonitorSettings(spool_dir=sys.argv[3], linger=5.0))
model = torch.nn.Linear(2, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
mon.watch(model, opt)
for step in range(1, {steps} + 1):
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    opt.zero_grad()
    mon.log_step(step, loss=float(step))
mon.flush(timeout=10)
{stuck}
"""


def _start(receiver, tmp_path: Path, run_id: str, before: str = "",
           stuck: str = "time.sleep(600)", env: dict | None = None) -> subprocess.Popen:
    script = textwrap.dedent(SCRIPT).format(before=before, stuck=stuck, steps=STEPS)
    environ = {"PYTHONPATH": f"{REPO / 'client'}:{REPO}", "PATH": "/usr/bin:/bin",
               "OMP_NUM_THREADS": "1", **(env or {})}
    proc = subprocess.Popen([sys.executable, "-c", script, receiver.url, run_id,
                             str(tmp_path)], env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    # A cold torch import on a loaded 2-core box takes tens of seconds: the wait is the
    # process's start, not the client's delivery (which the assertions below are about).
    eventually(lambda: any(r["step"] == STEPS for r in receiver.of_kind("step")
                           if r["run_id"] == run_id), timeout=60,
               what=f"{run_id}'s last step", context=lambda: _output(proc))
    return proc


def _output(proc: subprocess.Popen) -> str:
    """What the script printed, for a failure's message (the process is ended for it)."""
    proc.kill()
    out, err = proc.communicate(timeout=30)
    return f"exit {proc.returncode}; stdout: {out[-2000:]!r}; stderr: {err[-4000:]!r}"


def _ends(receiver, run_id: str) -> list[dict]:
    return [r for r in receiver.of_kind("end") if r["run_id"] == run_id]


def test_sigterm_ends_the_run_stopped_with_every_step(receiver, tmp_path):
    """The steps after the last flush would wait in the queue for a 5 s linger: SIGTERM's
    default death lost them and the run's end."""
    proc = _start(receiver, tmp_path, "term", stuck=textwrap.dedent("""
        mon.log_step(STEPS_PLUS_ONE, loss=1.0)
        print("logged", flush=True)
        time.sleep(600)
    """).replace("STEPS_PLUS_ONE", str(STEPS + 1)))
    assert proc.stdout is not None and proc.stdout.readline() == "logged\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    end, = _ends(receiver, "term")
    assert end["status"] == "stopped" and end["error"].startswith("SIGTERM")
    assert end["step"] == STEPS + 1
    assert [r["step"] for r in receiver.of_kind("step")] == list(range(1, STEPS + 2))


def test_sigterm_ends_the_run_while_the_main_thread_cannot_run_python(receiver, tmp_path):
    """The main thread waits where no Python handler can run (here SIGTERM is blocked for
    it, as for a thread stuck in a collective): the signal is read on a thread of the
    client's own, which ends the run and the process; without it the process would sleep on
    for ten minutes."""
    proc = _start(receiver, tmp_path, "stuck", stuck=(
        "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
        "print('waiting', flush=True)\ntime.sleep(600)"))
    assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    end, = _ends(receiver, "stuck")
    assert end["status"] == "stopped" and end["step"] == STEPS


def test_a_forked_child_that_gets_sigterm_dies_of_it_and_the_run_goes_on(receiver, tmp_path):
    """A DataLoader worker is a forked child: it dies of SIGTERM as before, and does not
    end its parent's run (nor write into its parent's signal pipe)."""
    proc = _start(receiver, tmp_path, "fork", stuck=textwrap.dedent("""
        child = os.fork()
        if child == 0:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(600)
        _, status = os.waitpid(child, 0)
        print(os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, flush=True)
        time.sleep(1)
        mon.close()
    """))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "True\n"
    end, = _ends(receiver, "fork")
    assert end["status"] == "completed"


def test_sigterm_is_left_alone_where_the_script_owns_it(receiver, tmp_path):
    """A script that handles SIGTERM itself keeps its handler."""
    before = ("signal.signal(signal.SIGTERM, lambda *_: (print('mine', flush=True), "
              "sys.exit(7)))")
    proc = _start(receiver, tmp_path, "own_handler", before=before)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 7
    assert proc.stdout is not None and proc.stdout.read() == "mine\n"
    assert len(_ends(receiver, "own_handler")) == 1  # its sys.exit ran the client's atexit


@pytest.mark.parametrize("stuck", ["sleeping", "blocked"])
def test_a_torchrun_worker_says_its_launcher_stopped_it_and_dies_of_sigterm(
        receiver, tmp_path, stuck):
    """torchrun's agent stops every worker with SIGTERM when one of them died: each says so
    (the rank killed outright is then the only one without a word: the sidecar names it)
    and still dies of the signal, which is how the agent reports its workers' deaths; also
    while its main thread waits where no Python handler runs (a collective)."""
    block = "signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})\n"
    wait = (block if stuck == "blocked" else "") + "print('waiting', flush=True)\ntime.sleep(600)"
    proc = _start(receiver, tmp_path, stuck, stuck=wait, env={"TORCHELASTIC_RUN_ID": "job-1"})
    assert proc.stdout is not None and proc.stdout.readline() == "waiting\n"
    proc.send_signal(signal.SIGTERM)
    # Its main thread dies of it; a thread of the client's exits 143 (128 + SIGTERM)
    assert proc.wait(timeout=60) == (-signal.SIGTERM if stuck == "sleeping" else 143)
    end, = _ends(receiver, stuck)
    assert end["status"] == "stopped" and end["step"] == STEPS
    assert end["error"].startswith("SIGTERM: stopped by its launcher")


def test_the_monitor_gives_sigterm_back_when_it_closes(tmp_path):
    from monitor_client import Monitor, MonitorSettings

    before = signal.getsignal(signal.SIGTERM)
    mon = Monitor(url="http://127.0.0.1:9", run_id="give-back", settings=MonitorSettings(
        spool_dir=str(tmp_path)))
    assert signal.getsignal(signal.SIGTERM) is not before
    mon.close(timeout=0.1)
    assert signal.getsignal(signal.SIGTERM) is before
    assert signal.set_wakeup_fd(-1) == -1


def test_a_handler_that_takes_sigterm_over_later_decides_and_the_run_says_stopped(
        receiver, tmp_path):
    """A framework that installs its SIGTERM handler after the Monitor and calls the one it
    found (Lightning's trainer does, and stops training at the next step): the process is
    not ended under it, and the run it ends says SIGTERM stopped it."""
    proc = _start(receiver, tmp_path, "composed", stuck=textwrap.dedent("""
        found = signal.getsignal(signal.SIGTERM)
        asked = []
        def graceful(signum, frame):
            found(signum, frame)
            asked.append(signum)
        signal.signal(signal.SIGTERM, graceful)
        print("ready", flush=True)
        while not asked:
            time.sleep(0.01)
        print("stopping at the step's end", flush=True)
        mon.close()
    """))
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out == "stopping at the step's end\n"
    end, = _ends(receiver, "composed")
    assert end["status"] == "stopped" and end["error"].startswith("SIGTERM")


def test_sigterm_during_the_close_after_a_crash_waits_for_the_end_to_be_sent(receiver, tmp_path):
    """torchrun stops the other ranks with SIGTERM right after one crashed, while each is
    still sending its queue and its end in the exit's close: the close goes on (here the
    sidecar refuses a while, then takes it), the end says the crash, and only then does
    the process end as SIGTERM asked. The signal's default death lost both."""
    proc = _start(receiver, tmp_path, "crash_term", stuck=textwrap.dedent("""
        mon.close_timeout = 60
        print("ready", flush=True)
        while not os.path.exists(os.path.join(sys.argv[3], "go")):
            time.sleep(0.01)
        raise RuntimeError("Connection closed by peer")
    """))
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    receiver.fail_status = 503  # the sidecar answers "later" to the close's first tries
    tried = receiver.posts
    (tmp_path / "go").touch()
    eventually(lambda: receiver.posts > tried, timeout=30, what="the close's first try",
               context=lambda: _output(proc))
    proc.send_signal(signal.SIGTERM)
    tried = receiver.posts
    eventually(lambda: receiver.posts > tried, timeout=30,
               what="a try of the close's after SIGTERM", context=lambda: _output(proc))
    receiver.fail_status = None
    assert proc.wait(timeout=60) == 143
    end, = _ends(receiver, "crash_term")
    assert (end["status"], end["error"]) == ("failed", "RuntimeError: Connection closed by peer")


def test_sigterm_after_a_crash_does_not_make_the_run_stopped(receiver, tmp_path):
    """The crash is what ended the run; the launcher's SIGTERM that follows it (before the
    exit's close began) is not: the end still says failed, with the exception."""
    proc = _start(receiver, tmp_path, "crash_then_term", stuck=textwrap.dedent("""
        import atexit
        # Registered after the Monitor's, so run before its close: the exit waits here.
        atexit.register(lambda: (print("exiting", flush=True), time.sleep(600)))
        raise ValueError("bad shard")
    """))
    assert proc.stdout is not None and proc.stdout.readline() == "exiting\n"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 143
    end, = _ends(receiver, "crash_then_term")
    assert (end["status"], end["error"]) == ("failed", "ValueError: bad shard")
