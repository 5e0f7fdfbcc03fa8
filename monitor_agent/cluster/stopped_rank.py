"""A stopped rank of this node ended at once when its run's restart is decided.

A ``restart`` (alerting/restart.py) makes every rank leave with exit 75 from its client's
own thread; a rank whose process is stopped (SIGSTOP, a frozen process) cannot, and its
launcher ends it only after its own grace (torchrun: SIGTERM, then SIGKILL 30 s later),
which the whole job waits out. The sidecar of that rank's own node SIGKILLs it instead, the
moment the restart is decided (here, or adopted from the run's leader), so the launcher
runs the job again without waiting.

What comes in records is hostile input (docs/scaling-out.md, the peer link): no record
alone makes a sidecar signal anything. All of these must hold:

- a ``restart`` or ``exclude`` action of the run is decided, not yet honoured
  (pipeline/consequences.py);
- the rank is this sidecar's own: its run record came to this sidecar's ingest, not as
  another node's digest (``RunState.processes`` keeps only those);
- the record's ``process`` (docs/format.md) names this machine's boot
  (``/proc/sys/kernel/random/boot_id``), and ``/proc/<pid>/stat`` says the same start time
  (a pid reused by another process, or one of another machine, does not match);
- the process is stopped (state ``T``): a running rank leaves by itself, and one traced by
  a debugger (``t``) is left alone;
- it belongs to this sidecar's own user (a sidecar never signals another user's process,
  even as root).

The pid is held through a pidfd while it is checked and signalled, so it cannot be reused
by another process in between. ``cluster.end_stopped_ranks: false`` turns this off.

    >>> import os
    >>> me = ProcessIdentity(os.getpid(), read_stat(os.getpid()).start, boot_id() or "")
    >>> end_stopped(me)                 # running: it leaves by itself
    'running'
    >>> end_stopped(ProcessIdentity(me.pid, me.start + 1, me.boot))
    'another process'
    >>> end_stopped(ProcessIdentity(me.pid, me.start, "00000000-0000-0000-0000-000000000000"))
    'another machine'
"""

from __future__ import annotations

import errno
import os
import signal
from dataclasses import dataclass
from pathlib import Path

from monitor_agent.records.types import ProcessIdentity

__all__ = ["ENDED", "ProcessStat", "boot_id", "end_stopped", "read_stat"]

ENDED = "ended"
_PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcessStat:
    """What ``/proc/<pid>/stat`` says of a process: its state letter and start time."""

    state: str
    start: int


def boot_id(proc: Path = _PROC) -> str | None:
    """This machine's boot id, or None where /proc does not say."""
    try:
        return (proc / "sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def read_stat(pid: int, proc: Path = _PROC) -> ProcessStat | None:
    """The state and start time of process ``pid``, or None when it is gone."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': the fields
    # after its last ')' start at field 3, the state; the start time is field 22.
    fields = raw[raw.rfind(b")") + 2:].split()
    if len(fields) < 20 or not fields[19].isdigit():
        return None
    return ProcessStat(fields[0].decode(errors="replace"), int(fields[19]))


def end_stopped(process: ProcessIdentity, proc: Path = _PROC) -> str:
    """SIGKILL the process ``process`` names if it is this machine's, still that process,
    this user's and stopped; what was found ("ended", else why not)."""
    if process.boot != boot_id(proc):
        return "another machine"
    if not hasattr(os, "pidfd_open"):  # not Linux: no way to hold the pid while checking
        return "no pidfd here"
    try:
        fd = os.pidfd_open(process.pid)  # held: the pid cannot name another process now
    except OSError as exc:
        return "gone" if exc.errno == errno.ESRCH else f"not signalled: {exc.strerror or exc}"
    try:
        stat = read_stat(process.pid, proc)
        if stat is None:
            return "gone"
        if stat.start != process.start:
            return "another process"
        if (proc / str(process.pid)).stat().st_uid != os.geteuid():
            return "another user's"
        if stat.state != "T":
            return "running" if stat.state not in ("Z", "X") else "gone"
        signal.pidfd_send_signal(fd, signal.SIGKILL)
        return ENDED
    except OSError as exc:
        return f"not signalled: {exc.strerror or exc}"
    finally:
        os.close(fd)
