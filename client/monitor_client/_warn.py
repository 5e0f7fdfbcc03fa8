"""Rate-limited warnings: monitoring problems are reported, never raised into training.

The client's parts share one ``Warner``: ``warner.warn("post", "sidecar unreachable: %s",
err)`` logs to the ``monitor_client`` logger at most once per key and interval (see the
example of ``Warner``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LOGGER = logging.getLogger("monitor_client")


class Warner:
    """Logs each key at most once per ``interval`` seconds and counts what it held back.

    At 0, 10 and 40 s (a fake clock; a logger that prints)::

        >>> from types import SimpleNamespace
        >>> clock = iter([0.0, 10.0, 40.0]).__next__
        >>> printer = SimpleNamespace(warning=lambda msg, *args: print(msg % args))
        >>> warner = Warner(interval=30.0, logger=printer, now=clock)
        >>> warner.warn("post", "sidecar unreachable: %s", "refused")
        monitor_client: sidecar unreachable: refused
        True
        >>> warner.warn("post", "sidecar unreachable: %s", "refused")
        False
        >>> warner.warn("post", "sidecar unreachable: %s", "refused")
        monitor_client: sidecar unreachable: refused (1 similar warnings suppressed)
        True
    """

    def __init__(self, interval: float = 30.0, logger: logging.Logger = LOGGER,
                 now: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.logger = logger
        self._now = now
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}
        self._lock = threading.Lock()

    def warn(self, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless ``key`` was logged recently; return whether it was."""
        with self._lock:
            now = self._now()
            last = self._last.get(key)
            if last is not None and now - last < self.interval:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return False
            self._last[key] = now
            held = self._suppressed.pop(key, 0)
        suffix = f" ({held} similar warnings suppressed)" if held else ""
        self.logger.warning("monitor_client: " + msg + suffix, *args)
        return True
