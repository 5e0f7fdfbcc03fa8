"""Shared request dependencies: the optional bearer token, and access to app state.

A rejected token is logged (at most once a minute, with a count of the others) so an
operator sees that a client is misconfigured; the token itself is never logged.
"""

from __future__ import annotations

import hmac
import logging
import threading
import time

from fastapi import HTTPException, Request

log = logging.getLogger(__name__)
AUTH_LOG_INTERVAL_S = 60.0


class RejectionLog:
    """Rate-limited log of 401s: one line per interval, counting what it held back."""

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


def _rejection_log(request: Request) -> RejectionLog:
    state = request.app.state
    if getattr(state, "rejection_log", None) is None:
        state.rejection_log = RejectionLog()
    return state.rejection_log


def require_write(request: Request) -> None:
    """Reject writes and admin calls without the configured bearer token (if one is set)."""
    token = request.app.state.settings.token_value()
    if token is None:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    # compare_digest: the time taken must not reveal how much of the token matched.
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
        why = "wrong bearer token" if given and scheme.lower() == "bearer" else (
            "no bearer token")
        _rejection_log(request).rejected(request, why)
        raise HTTPException(
            status_code=401,
            detail="missing or invalid bearer token (send 'Authorization: Bearer <token>')",
            headers={"WWW-Authenticate": "Bearer"},
        )


def require_read(request: Request) -> None:
    """Reads are open unless ``auth_reads`` is set; then they need the token too."""
    if request.app.state.settings.auth_reads:
        require_write(request)
