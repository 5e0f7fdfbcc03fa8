"""``RejectionLog``: the 401s a guarded route answers, logged at most once an interval.

``api/deps.py``'s guards call ``rejected`` for each request they refuse.
"""

from __future__ import annotations

import logging
import threading
import time

from fastapi import Request

log = logging.getLogger(__name__)
AUTH_LOG_INTERVAL_S = 60.0


class RejectionLog:
    """Rate-limited log of 401s: one line per interval, counting what it held back.

    An operator should see that a client is misconfigured, not one line per request; the
    token itself is never logged.
    """

    def __init__(self, interval: float = AUTH_LOG_INTERVAL_S) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._held = 0

    def rejected(self, request: Request, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.interval:
                self._held += 1
                return
            self._last, held, self._held = now, self._held, 0
        client = request.client.host if request.client else "?"
        more = f" ({held} more since the last such line)" if held else ""
        log.warning("401 for %s %s from %s: %s%s", request.method, request.url.path, client,
                    why, more)
