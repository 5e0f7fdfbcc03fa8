"""cluster/stopped_rank.py on real processes: a stopped process that is the one named
(pid, start time, this machine's boot) and this user's is ended; anything else is left
alone, whatever the record claims."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest

from monitor_agent.cluster.stopped_rank import ENDED, boot_id, end_stopped, read_stat
from monitor_agent.records.types import ProcessIdentity
from tests.eventually import eventually

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc")


@contextmanager
def process(stopped: bool = True, user: int | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A child that sleeps (a rank), stopped by SIGSTOP when ``stopped``."""
    proc = subprocess.Popen(["sleep", "600"], user=user)
    try:
        if stopped:
            proc.send_signal(signal.SIGSTOP)
            eventually(lambda: read_stat(proc.pid).state == "T", timeout=10,  # type: ignore[union-attr]
                       what="the child stopped")
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()


def identity(proc: subprocess.Popen[bytes]) -> ProcessIdentity:
    stat = read_stat(proc.pid)
    assert stat is not None and boot_id() is not None
    return ProcessIdentity(proc.pid, stat.start, boot_id() or "")


def test_a_stopped_process_that_is_the_one_named_is_killed():
    with process() as proc:
        assert end_stopped(identity(proc)) == ENDED
        assert proc.wait(timeout=30) == -signal.SIGKILL


def later_tick(than: int) -> None:
    """Wait until the boot clock is past tick ``than``: a process started now has a start
    time of its own (two started within one tick share it)."""
    tick = os.sysconf("SC_CLK_TCK")
    eventually(lambda: time.clock_gettime(time.CLOCK_BOOTTIME) * tick > than + 1,
               timeout=10, what="a later clock tick")


@pytest.mark.parametrize("forge", ["start", "pid", "boot"])
def test_a_forged_or_mismatched_identity_signals_nothing(forge: str):
    with ExitStack() as stack:
        proc = stack.enter_context(process())
        me = identity(proc)
        later_tick(me.start)
        other = stack.enter_context(process())
        forged = {"start": ProcessIdentity(me.pid, me.start + 1, me.boot),
                  # another stopped process's pid, with this one's start time
                  "pid": ProcessIdentity(other.pid, me.start, me.boot),
                  "boot": ProcessIdentity(me.pid, me.start, "0" * 8 + "-0000-0000-0000-"
                                          + "0" * 12)}[forge]
        assert end_stopped(forged) in ("another process", "another machine")
        for child in (proc, other):
            assert child.poll() is None and read_stat(child.pid).state == "T"  # type: ignore[union-attr]


def test_a_running_process_is_left_to_leave_by_itself():
    with process(stopped=False) as proc:
        assert end_stopped(identity(proc)) == "running"
        assert proc.poll() is None


def test_a_process_that_is_gone_is_not_signalled():
    with process() as proc:
        me = identity(proc)
        proc.kill()
        proc.wait()
        assert end_stopped(me) == "gone"


@pytest.mark.skipif(os.geteuid() != 0, reason="starting a process as another user needs root")
def test_another_users_stopped_process_is_never_signalled():
    with process(user=65534) as proc:
        assert end_stopped(identity(proc)) == "another user's"
        assert proc.poll() is None
