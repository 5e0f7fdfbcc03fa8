"""``AttemptDeadline``: one delivery attempt, connect to the last byte of the answer, bounded.

httpx's timeouts are per operation: a receiver that trickles one byte every few seconds
never trips a read timeout, and the sender that waits on it waits for ever, its channel's
queue behind it. A deadline bounds the whole attempt instead: a timer shuts down the
attempt's socket when the time is up, so whatever the sender was blocked on returns at
once, and the outbox counts a failed attempt with an error and retries on its schedule.

Every attempt opens its own connection (``Connection: close``), so the socket to shut
down is always the one that httpcore's trace reports opening; notifications are few, and
a fresh connection per message costs nothing that matters. Connecting itself is bounded
by the channel's own timeout (there is no socket to shut down yet).

The hooks are installed on whatever client the sender holds, for one attempt; against a
receiver that answers at once the deadline does nothing::

    >>> ok = httpx.MockTransport(lambda request: httpx.Response(200))
    >>> with httpx.Client(transport=ok) as client, AttemptDeadline(client, 5.0) as deadline:
    ...     client.post("http://receiver.invalid/").status_code, deadline.expired
    (200, False)
"""

from __future__ import annotations

import contextlib
import socket
import threading
from types import TracebackType
from typing import Any

import httpx

# httpcore's trace events whose return value is the stream now carrying the request.
_OPENED = ("connection.connect_tcp.complete", "connection.start_tls.complete")


class AttemptDeadline:
    """A context manager: ``seconds`` for everything the client does inside it."""

    def __init__(self, client: httpx.Client, seconds: float) -> None:
        self.client = client
        self.seconds = seconds
        self.expired = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True

    def __enter__(self) -> AttemptDeadline:
        hooks = self.client.event_hooks
        hooks["request"] = [*hooks.get("request", []), self._on_request]
        self.client.event_hooks = hooks
        self._timer.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._timer.cancel()
        hooks = self.client.event_hooks
        hooks["request"] = [h for h in hooks.get("request", []) if h != self._on_request]
        self.client.event_hooks = hooks

    def _on_request(self, request: httpx.Request) -> None:
        request.headers["connection"] = "close"  # no pooled socket the trace would not see
        request.extensions["trace"] = self._trace

    def _trace(self, event: str, info: dict[str, Any]) -> None:
        if event not in _OPENED:
            return
        sock = info["return_value"].get_extra_info("socket")
        if sock is None:
            return
        with self._lock:
            self._sockets.append(sock)
            late = self.expired
        if late:  # the time ran out while connecting
            _shut(sock)

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    # shutdown, not close: the blocked recv in the sender's thread returns at once, and
    # the socket stays the sender's to close (closing it under a reader is unsafe).
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
