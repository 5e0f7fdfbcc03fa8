"""SIGTERM ends the run as ``stopped`` before the process dies of it.

A scheduler asks a job to leave with SIGTERM (Slurm's preemption, time limit and
``scancel``; Kubernetes' pod deletion), and Python's default is to die at once: no
``atexit``, so the client's last records (up to a linger's worth) and the run's end are
lost, and the sidecar later pages a run that went silent. With this installed, SIGTERM
marks the run ``stopped`` (``SIGTERM``), closes the Monitor (its end record and what is
pending, within its close timeout) and exits with status 143 (128 + SIGTERM), as a
process killed by it reports in a shell.

The main thread may be stuck where no Python handler runs (a collective that never
returns): the signal is also read from ``signal.set_wakeup_fd`` by a thread of its own,
which acts at once; whichever of the two comes first ends the process.

A worker of torchrun's elastic agent still dies of SIGTERM itself (the agent owns its
workers' lives: it stops every worker with SIGTERM when one of them failed or the job
re-forms, and reads their deaths), but says first that its launcher stopped it
(``LAUNCHER_STOPPED``), within its close timeout: when a rank's process is killed outright,
every other rank then ends with a word and the dead one is the only rank without one, which
is how the sidecar names it (monitor_agent/runs/attempt_end.py).

Left alone, so that the process dies of SIGTERM as it did:
- a script or framework that handles SIGTERM itself (its handler is not the default). One
  that takes SIGTERM over later and calls the handler it found (Lightning's trainer
  composes it with its own, and stops at the next step) decides whether and when the
  process ends: the run is then only marked ``stopped``, ended by its own close;
- a process whose wakeup fd is taken (an asyncio loop), or a Monitor made off the main
  thread;
- a forked child (a DataLoader worker): it gets the default back, and does not write into
  its parent's pipe.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable
from typing import Any

EXIT_STATUS = 128 + signal.SIGTERM
MAIN_THREAD_GRACE_S = 0.5  # a main thread free to run Python enters its handler well within
TERMINATED = "SIGTERM: the process was asked to stop (a scheduler's preemption, time limit " \
    "or cancel, or a kill)"
LAUNCHER_STOPPED = "SIGTERM: stopped by its launcher (torchrun's agent stops every worker " \
    "when one of them failed or the job re-forms)"


class TermWatch:
    """On SIGTERM: ``on_signal(error)`` (the run's outcome: ``TERMINATED``, or
    ``LAUNCHER_STOPPED`` under torchrun), then, while SIGTERM's handler is still this one,
    ``on_end()`` (the run's close) and the process exits with ``EXIT_STATUS`` (under
    torchrun: dies of SIGTERM, as its agent expects). ``on_end()`` returning False means a
    close is already draining on the thread the handler interrupted (a launcher's SIGTERM
    right after a crash, while the exit's close sends what is queued): the handler returns
    so that the drain goes on, and that close calls ``finish()`` when it is done."""

    def __init__(self, on_signal: Callable[[str], object], on_end: Callable[[], object]) -> None:
        self._on_signal, self._on_end = on_signal, on_end
        self._pipe: tuple[int, int] | None = None
        self._pid = os.getpid()
        self._once = threading.Lock()
        self._launched = False  # a worker of torchrun's elastic agent
        self._in_handler = threading.Event()  # the main thread runs the Python handler
        self.pending = False  # SIGTERM came during a close's drain: ``finish`` ends us

    def install(self) -> bool:
        """Take SIGTERM when nobody else has; False (nothing changed) otherwise."""
        if (threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
            return False
        read, write = os.pipe()
        os.set_blocking(write, False)
        previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        if previous != -1:  # someone else's (an event loop): put it back, stay out
            signal.set_wakeup_fd(previous)
            os.close(read)
            os.close(write)
            return False
        signal.signal(signal.SIGTERM, self._in_main)
        self._pipe, self._pid = (read, write), os.getpid()
        self._launched = bool(os.environ.get("TORCHELASTIC_RUN_ID"))
        os.register_at_fork(after_in_child=self._forked)
        threading.Thread(target=self._watch, args=(read,), name="monitor-client-sigterm",
                         daemon=True).start()
        return True

    def remove(self) -> None:
        """Give SIGTERM and the wakeup fd back (main thread; elsewhere, as the process
        ends on its own, nothing needs giving back)."""
        pipe, self._pipe = self._pipe, None
        if pipe is None or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if signal.set_wakeup_fd(-1) not in (pipe[1], -1):
            signal.set_wakeup_fd(pipe[1])  # not ours any more: leave it as it was
        os.close(pipe[1])  # the watching thread reads the end of its pipe and leaves

    def _forked(self) -> None:
        if self._pipe is None:
            return
        read, write = self._pipe
        self._pipe = None
        if signal.getsignal(signal.SIGTERM) == self._in_main:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            signal.set_wakeup_fd(-1)
        os.close(read)
        os.close(write)

    def _watch(self, read: int) -> None:
        try:
            while data := os.read(read, 64):
                # The main thread's handler, when it can run, ends the process (it alone
                # may die of the signal); this thread acts when it does not start at once.
                if signal.SIGTERM in data and os.getpid() == self._pid and self._owned() \
                        and not self._in_handler.wait(MAIN_THREAD_GRACE_S):
                    self._end()
        finally:
            os.close(read)

    def _in_main(self, _signum: int, _frame: Any) -> None:
        self._in_handler.set()
        if os.getpid() != self._pid:  # a child forked some other way: die as it would have
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        if not self._owned():  # called by the handler that took SIGTERM over: it decides
            self._on_signal(self._error())
            return
        self._end()

    def _error(self) -> str:
        return LAUNCHER_STOPPED if self._launched else TERMINATED

    def _owned(self) -> bool:
        return signal.getsignal(signal.SIGTERM) == self._in_main

    def _end(self) -> None:
        with self._once:  # the second caller waits here for the first one's exit
            deferred = False
            try:
                self._on_signal(self._error())
                deferred = self._on_end() is False
            finally:
                if deferred:  # a close was draining: it ends the process when done (finish)
                    self.pending = True
                else:
                    self._die()

    def finish(self) -> None:
        """End the process as SIGTERM asked, when it came while a close was draining: the
        handler returned (``on_end`` said False) so that the drain could go on."""
        if self.pending:
            self._die()

    def _die(self) -> None:
        # The agent reports a worker's death by its signal; only the main thread may give
        # SIGTERM back to its default (a main thread stuck in a collective leaves the
        # status, which the agent reads as a failed worker all the same).
        if self._launched and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
        os._exit(EXIT_STATUS)
