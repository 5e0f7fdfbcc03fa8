"""One CPU cgroup per node: every process the node runs is in it (so teardown finds them
all, forks and daemons included), its CPU time is measured, and a quota throttles it.

cgroup v1 (``/sys/fs/cgroup/cpu`` with ``cpu.cfs_quota_us``, and ``cpuacct.usage`` where
``cpuacct`` is mounted apart) or, on a machine with only the unified hierarchy, cgroup v2
(``cpu.max``, ``cpu.stat``). A process joins by writing its pid to ``cgroup.procs`` before
it execs the node's command (``Node.command``), so its children are born inside.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path("/sys/fs/cgroup")
# The CFS period under a quota: 10 ms rather than the default 100 ms, so a step of tens of
# milliseconds is slowed evenly instead of running free and then sitting out a whole period.
PERIOD_US = 10_000
LONG_PERIOD_US = 100_000  # the kernel's default, for quotas under MIN_QUOTA_US / PERIOD_US
MIN_QUOTA_US = 1_000  # the kernel's floor


def _mounts() -> dict[str, Path]:
    """Where each cgroup hierarchy this module uses is mounted: ``cpu``, ``cpuacct`` (v1)
    or ``unified`` (v2)."""
    found: dict[str, Path] = {}
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) < 4:
            continue
        mount, kind, opts = Path(parts[1]), parts[2], set(parts[3].split(","))
        if kind == "cgroup":
            for ctrl in ("cpu", "cpuacct"):
                if ctrl in opts:
                    found.setdefault(ctrl, mount)
        elif kind == "cgroup2":
            found.setdefault("unified", mount)
    if "cpu" not in found and "unified" in found:
        controllers = (found["unified"] / "cgroup.controllers")
        if not (controllers.exists() and "cpu" in controllers.read_text().split()):
            del found["unified"]
    return found


def available() -> str | None:
    """None, or why no CPU cgroup can be made here."""
    m = _mounts()
    if "cpu" in m or "unified" in m:
        return None
    return "no cgroup v1 'cpu' hierarchy and no cgroup v2 with the cpu controller mounted"


class NodeCgroup:
    """The cgroup ``<prefix>/<name>`` in the CPU hierarchies."""

    def __init__(self, prefix: str, name: str) -> None:
        m = _mounts()
        self.v2 = "cpu" not in m
        if self.v2:
            self.dirs = [m["unified"] / prefix / name]
        else:
            self.dirs = list(dict.fromkeys([m["cpu"] / prefix / name,
                                            m.get("cpuacct", m["cpu"]) / prefix / name]))
        self.cpu_dir = self.dirs[0]
        self.acct_dir = self.dirs[-1]

    def create(self) -> NodeCgroup:
        for d in self.dirs:
            if self.v2:
                parent = d.parent
                parent.mkdir(exist_ok=True)
                (parent.parent / "cgroup.subtree_control").write_text("+cpu")
                (parent / "cgroup.subtree_control").write_text("+cpu")
            d.mkdir(parents=True, exist_ok=True)
        return self

    def join_script(self) -> str:
        """Shell that moves the running shell (``$$``) into this cgroup."""
        return " && ".join(f"echo $$ > {d / 'cgroup.procs'}" for d in self.dirs)

    def pids(self) -> list[int]:
        return pids_in(self.cpu_dir)

    def contains(self, pid: int) -> bool:
        return pid in self.pids()

    def kill_all(self) -> None:
        kill_all_in(self.cpu_dir)

    def usage_seconds(self) -> float:
        """CPU seconds the node's processes used since the cgroup was made."""
        if self.v2:
            for line in (self.acct_dir / "cpu.stat").read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
            return 0.0
        return int((self.acct_dir / "cpuacct.usage").read_text()) / 1e9

    def set_quota(self, cores: float | None) -> int:
        """Cap the node at ``cores`` CPUs (None: no cap); returns the quota in us per
        period (``PERIOD_US``, or ``LONG_PERIOD_US`` under a tenth of a CPU), -1 when
        uncapped."""
        period = PERIOD_US
        if cores is not None and cores * period < MIN_QUOTA_US:
            period = LONG_PERIOD_US  # below a tenth of a CPU: the kernel's floor needs it
        quota = -1 if cores is None else max(MIN_QUOTA_US, round(cores * period))
        if self.v2:
            (self.cpu_dir / "cpu.max").write_text(f"{'max' if quota < 0 else quota} {period}")
        else:
            # quota first when lifting it: a period shorter than the quota is refused
            (self.cpu_dir / "cpu.cfs_quota_us").write_text("-1")
            (self.cpu_dir / "cpu.cfs_period_us").write_text(str(period))
            (self.cpu_dir / "cpu.cfs_quota_us").write_text(str(quota))
        return quota

    def quota(self) -> tuple[int, int]:
        """(quota us, period us) as the kernel has them; quota -1 is no cap."""
        if self.v2:
            q, p = (self.cpu_dir / "cpu.max").read_text().split()
            return (-1 if q == "max" else int(q)), int(p)
        return (int((self.cpu_dir / "cpu.cfs_quota_us").read_text()),
                int((self.cpu_dir / "cpu.cfs_period_us").read_text()))

    def throttled_seconds(self) -> float:
        """Time the node's processes spent held back by the quota."""
        for line in (self.cpu_dir / "cpu.stat").read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == "throttled_time":
                return int(value) / 1e9
            if key == "throttled_usec":
                return int(value) / 1e6
        return 0.0

    def remove(self) -> None:
        self.kill_all()
        for d in self.dirs:
            rmdir(d)
            parent = d.parent
            if parent.exists() and not any(p.is_dir() for p in parent.iterdir()):
                rmdir(parent)


def pids_in(d: Path) -> list[int]:
    """The processes in cgroup directory ``d`` (none when it is gone)."""
    try:
        return [int(p) for p in (d / "cgroup.procs").read_text().split()]
    except FileNotFoundError:
        return []


def kill_all_in(d: Path, timeout: float = 10.0) -> None:
    """SIGKILL every process in cgroup ``d`` until none is left (one may fork meanwhile)."""
    deadline = time.monotonic() + timeout
    while pids := pids_in(d):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{d}: processes {pids} survive SIGKILL")
        time.sleep(0.05)


def rmdir(d: Path, timeout: float = 5.0) -> None:
    """rmdir a cgroup; a process just killed may hold it busy for a moment."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            d.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def leftover_groups(is_ours: Callable[[str], bool]) -> list[Path]:
    """Top-level cgroups (``<prefix>``) whose name ``is_ours(name)`` says belongs to us."""
    out = []
    for mount in set(_mounts().values()):
        if mount.is_dir():
            out += [d for d in mount.iterdir() if d.is_dir() and is_ours(d.name)]
    return sorted(out)
