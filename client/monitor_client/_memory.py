"""Memory of the training process: the CUDA caching allocator on GPU, RSS on CPU.

Each probe answers docs/format.md's ``memory`` object. Probes are read from the sender thread
(the allocator statistics and /proc are safe to read from any thread), keeping them off
the training thread.

On CPU, the process's resident memory::

    >>> reading = memory_probe("cpu").read()
    >>> sorted(reading)
    ['allocated_bytes', 'device', 'peak_allocated_bytes', 'reserved_bytes', 'total_bytes']
    >>> reading["device"], reading["allocated_bytes"] > 0, reading["reserved_bytes"]
    ('cpu', True, None)
"""

from __future__ import annotations

import os
import resource
import sys
import time
from pathlib import Path
from typing import Any, Protocol


class MemoryProbe(Protocol):
    def read(self) -> dict[str, Any]: ...


class CpuMemory:
    """Process RSS (now and peak) and the memory limit (cgroup, else physical memory).

    The limit can be given, e.g. what a scheduler allotted the job::

        >>> CpuMemory(total_bytes=8 << 30).read()["total_bytes"]
        8589934592
    """

    # A reading serves the steps materialised within this many seconds of it: the sender
    # reads a batch of steps at once (hundreds when each takes a millisecond), and opening
    # /proc for each cost about as much as the rest of the step's record. The reading is
    # already up to a batch's linger (0.5 s) later than its step; RSS moves slowly.
    MAX_AGE = 0.05

    def __init__(self, total_bytes: int | None = None,
                 now: Any = time.monotonic) -> None:
        self.total_bytes = total_bytes or _memory_limit()
        self._page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
        self._now = now
        self._last: tuple[float, dict[str, Any]] | None = None

    def read(self) -> dict[str, Any]:
        now = self._now()
        if self._last is not None and now - self._last[0] < self.MAX_AGE:
            return dict(self._last[1])
        reading = {"device": "cpu", "allocated_bytes": self._rss(), "reserved_bytes": None,
                   "peak_allocated_bytes": _peak_rss(), "total_bytes": self.total_bytes}
        self._last = (now, reading)
        return dict(reading)

    def _rss(self) -> int | None:
        try:
            with open("/proc/self/statm", "rb") as fh:
                return int(fh.read().split()[1]) * self._page
        except (OSError, ValueError, IndexError):
            return _peak_rss()


def _peak_rss() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB


def _memory_limit() -> int | None:
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            return int(text)
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


class CudaMemory:
    """The caching allocator's counters for one device, and the device's total memory.

    ``memory_probe("cuda:0")`` makes one (it needs a GPU); its ``read()`` has the keys of
    ``CpuMemory.read()``, from ``torch.cuda.memory_stats`` and ``torch.cuda.mem_get_info``.
    """

    def __init__(self, device: Any) -> None:
        import torch

        self._torch = torch
        self.device = torch.device(device)
        self.total_bytes = torch.cuda.mem_get_info(self.device)[1]

    def read(self) -> dict[str, Any]:
        allocated, reserved = self._nested()
        return {"device": str(self.device),
                "allocated_bytes": allocated.get("current"),
                "reserved_bytes": reserved.get("current"),
                "peak_allocated_bytes": allocated.get("peak"),
                "total_bytes": self.total_bytes}

    def _nested(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The allocator's counters as it keeps them: ``memory_stats`` flattens some 150
        keys in Python on every call, GIL held, once per step record; the two needed
        here are read from the nested dict instead (the public call when that fails)."""
        try:
            stats = self._torch._C._cuda_memoryStats(self.device.index or 0)
            return stats["allocated_bytes"]["all"], stats["reserved_bytes"]["all"]
        except Exception:  # noqa: BLE001 - a torch without the private call
            flat = self._torch.cuda.memory_stats(self.device)
            return ({"current": flat.get("allocated_bytes.all.current"),
                     "peak": flat.get("allocated_bytes.all.peak")},
                    {"current": flat.get("reserved_bytes.all.current")})


def memory_probe(device: Any) -> MemoryProbe:
    """The probe for a device ('cpu', 'cuda:0', a torch.device)."""
    if str(device).startswith("cuda"):
        return CudaMemory(device)
    return CpuMemory()
