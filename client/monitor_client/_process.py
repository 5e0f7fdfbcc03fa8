"""Which process this is, as the sidecar on its own machine can check it: its pid, its start
time and the machine's boot id (docs/format.md, ``process``).

A restart (``_restart.py``) makes every rank leave with exit 75 from its client's own
thread; a process that was stopped (SIGSTOP: a frozen rank) cannot. Its node's sidecar ends
it instead, at once, rather than leave it to the launcher's grace (torchrun: SIGTERM, then
SIGKILL 30 s later). It signals a process only if ``/proc/<pid>/stat`` still says this start
time and the boot id is its machine's (monitor_agent/cluster/stopped_rank.py): a pid reused
by another process, or a pid of another machine, is never signalled.

    >>> me = identity()
    >>> me is None or (me["pid"] == os.getpid() and me["start"] >= 0 and len(me["boot"]) == 36)
    True
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["identity", "start_ticks"]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def identity() -> dict[str, Any] | None:
    """``{pid, start, boot}`` of this process, or None where /proc does not say (not Linux)."""
    pid = os.getpid()
    start = start_ticks(pid)
    try:
        with open(_BOOT_ID) as src:
            boot = src.read(64).strip()
    except OSError:
        return None
    return None if start is None or not boot else {"pid": pid, "start": start, "boot": boot}


def start_ticks(pid: int, proc: str = "/proc") -> int | None:
    """The process's start time in clock ticks after boot (``/proc/<pid>/stat`` field 22),
    or None when it cannot be read."""
    try:
        with open(f"{proc}/{pid}/stat", "rb") as src:
            raw = src.read(4096)
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or ')': split after
    # its last ')'. What follows is field 3 (the state) onwards.
    fields = raw[raw.rfind(b")") + 2:].split()
    return int(fields[19]) if len(fields) > 19 and fields[19].isdigit() else None
