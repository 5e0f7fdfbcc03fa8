"""``TokenHealth``: whether the configured bearer token could be read at the last guarded
request (``api/deps.py`` reports each read; an unreadable token is a 503, logged once).

    >>> health = TokenHealth()
    >>> health.unavailable("token file missing")
    >>> health.reason
    'token file missing'
    >>> health.available()
    >>> health.reason is None
    True
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class TokenHealth:
    """Whether the configured token could be read at the last guarded request; each change
    is logged once (an outage is an error until fixed, not a line per request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: str | None = None

    def unavailable(self, reason: str) -> None:
        with self._lock:
            changed, self.reason = self.reason != reason, reason
        if changed:
            log.error("bearer token unavailable: %s; every guarded route answers 503 until "
                      "it is fixed", reason)

    def available(self) -> None:
        if self.reason is None:  # the common case: no lock, nothing to say
            return
        with self._lock:
            was, self.reason = self.reason, None
        if was is not None:
            log.warning("bearer token readable again; guarded routes accept it")
