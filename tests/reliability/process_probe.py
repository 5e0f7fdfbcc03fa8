"""What a process holds right now: resident memory, open files, threads.

Used by the soak and the cardinality attacks to show the sidecar's footprint stays flat.

Example::

    probe = ProcessProbe(sidecar.proc.pid)
    before = probe.sample()
    ...
    print(probe.sample().rss_mib - before.rss_mib)
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import psutil


@dataclass(frozen=True, slots=True)
class Footprint:
    """One sample of a process's resources."""

    at: float
    rss_bytes: int
    open_files: int
    threads: int

    @property
    def rss_mib(self) -> float:
        return self.rss_bytes / (1 << 20)


class ProcessProbe:
    """Samples a process by pid; ``peak`` tracks the highest RSS seen by ``watch``.

    Example::

        with ProcessProbe(pid).watching(0.05) as probe:
            attack()
        print(probe.peak_rss_bytes)
    """

    def __init__(self, pid: int) -> None:
        self.proc = psutil.Process(pid)
        self.peak_rss_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> Footprint:
        with self.proc.oneshot():
            rss = self.proc.memory_info().rss
            fds = self.proc.num_fds()
            threads = self.proc.num_threads()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        return Footprint(time.time(), rss, fds, threads)

    def watching(self, interval: float) -> ProcessProbe:
        """Sample in the background until the ``with`` block ends (peak RSS)."""
        self._interval = interval
        return self

    def __enter__(self) -> ProcessProbe:
        self._stop.clear()
        self.sample()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.sample()

    def _loop(self) -> None:
        while not self._stop.wait(getattr(self, "_interval", 0.1)):
            try:
                self.sample()
            except psutil.Error:
                return
