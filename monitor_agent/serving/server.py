"""The HTTP server around the app: uvicorn with a bound on slow and concurrent connections.

uvicorn closes idle keep-alive connections, but it waits for ever on a request that
arrives slowly: 1000 half-sent requests (slowloris) each keep a socket and a file
descriptor, and under a normal fd limit they take the sidecar down. ``GuardedProtocol``
adds what uvicorn lacks:

- a request's headers must arrive within ``header_timeout_seconds`` of its first byte (or
  of the connection opening), its body within ``request_timeout_seconds``; else the
  connection is closed;
- at most ``max_connections`` connections: one more closes the oldest connection that is
  still sending its request (an attacker's, most likely), so a real client's request gets
  through even during an attack; when every connection is busy with a real request, the
  new one is closed instead.

``monitor-agent serve`` (cli.py) runs ``uvicorn.Server(uvicorn_config(create_app(settings),
settings, settings.host, settings.port, ...)).run()``, and tests/reliability/test_slowloris.py
attacks such a server. Each app gets a protocol class with its settings' limits::

    >>> protocol = protocol_class(Settings(max_connections=100, header_timeout_seconds=5))
    >>> issubclass(protocol, GuardedProtocol), protocol.max_connections, protocol.header_timeout
    (True, 100, 5.0)
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import time
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from monitor_agent.settings import Settings


class GuardedProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with request-read deadlines and a connection bound."""

    header_timeout = 10.0
    request_timeout = 60.0
    max_connections = 500

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._opened = time.monotonic()
        self._receiving = True   # waiting for (part of) a request, not for our answer
        self._deadline: asyncio.TimerHandle | None = None
        self._arm(self.header_timeout)
        if len(self.connections) > self.max_connections:
            self._shed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._receiving = True
        if self._deadline is None:  # a new request on a kept-alive connection
            self._arm(self.header_timeout)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.request_timeout)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._receiving = False
        self._disarm()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)  # None before connection_made
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._receiving and not self.transport.is_closing():
            self.transport.close()

    def _shed(self) -> None:
        """Over the bound: close the oldest connection still sending a request, or this."""
        slow = [c for c in self.connections
                if isinstance(c, GuardedProtocol) and c is not self and c._receiving
                and not c.transport.is_closing()]
        victim = min(slow, key=lambda c: c._opened) if slow else self
        victim.transport.close()


M_MMAP_THRESHOLD = -3


def return_freed_memory(threshold: int = 1 << 20) -> None:
    """Make memory that a large request used go back to the OS when it is freed.

    glibc raises its mmap threshold each time a large mmapped block is freed (up to 32
    MiB), so after one 16 MiB inflated body, later big buffers come from the heap and the
    process keeps them: a rejected 50 KB request left 15 MiB held. A fixed threshold turns
    that off (a call of the sidecar process, at startup; no-op off glibc)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, threshold)


def protocol_class(settings: Settings) -> type[GuardedProtocol]:
    """A GuardedProtocol with this sidecar's limits (a class per app: no shared state)."""
    return type("SidecarProtocol", (GuardedProtocol,), {
        "header_timeout": settings.header_timeout_seconds,
        "request_timeout": settings.request_timeout_seconds,
        "max_connections": settings.max_connections,
    })


def uvicorn_config(app: Any, settings: Settings, host: str, port: int,
                   **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(app, host=host, port=port, http=protocol_class(settings),
                          timeout_keep_alive=5, **kwargs)
