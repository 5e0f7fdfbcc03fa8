"""The HTTP server around the app: uvicorn with a bound on slow and concurrent connections.

uvicorn closes idle keep-alive connections, but it waits for ever on a request that
arrives slowly: 1000 half-sent requests (slowloris) each keep a socket and a file
descriptor, and under a normal fd limit they take the sidecar down. ``GuardedProtocol``
adds what uvicorn lacks:

- a request's headers must arrive within ``header_timeout_seconds`` of its first byte (or
  of the connection opening), its body within ``request_timeout_seconds``; else the
  connection is closed;
- an answer the client stops reading is dropped: once the transport's write buffer is
  over its high-water mark (the kernel's socket buffer is full too), the client has
  ``write_timeout_seconds`` to read it down again, else the connection is aborted and
  what was buffered for it freed. Without this a 55-byte GET that never reads its answer
  held that answer for ever;
- at most ``max_connections`` connections, counting every state: sending a request,
  being answered, stalled on a client that does not read, idle between requests. One
  more sheds one, in this order, which is the fair one: first the connection stalled
  longest on a client that does not read (it holds our memory, and its client has shown
  it is not taking the answer), then the one waiting longest for a client's bytes (a
  half-sent request or an idle keep-alive: it holds a socket and no work of ours). A
  connection whose complete request is being answered while its client reads is never
  shed: that client did everything right. When every connection is one of those, the
  new one is closed instead. So ``/healthz`` and ingest get through a crowd of readers
  that do not read, as they do through a slowloris.

``monitor-agent serve`` (cli.py) runs ``uvicorn.Server(uvicorn_config(create_app(settings),
settings, settings.host, settings.port, ...)).run()``, and tests/reliability/test_slowloris.py
attacks such a server. Each app gets a protocol class with its settings' limits::

    >>> protocol = protocol_class(Settings(max_connections=100, header_timeout_seconds=5,
    ...                                     write_timeout_seconds=2))
    >>> issubclass(protocol, GuardedProtocol), protocol.max_connections, protocol.header_timeout
    (True, 100, 5.0)
    >>> protocol.write_timeout
    2.0
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
    """uvicorn's httptools protocol with read and write deadlines and a connection bound."""

    header_timeout = 10.0
    request_timeout = 60.0
    write_timeout = 30.0
    max_connections = 500

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._waiting_since = time.monotonic()  # for the client's bytes; shed order
        self._receiving = True   # waiting for (part of) a request, not for our answer
        self._stalled_since: float | None = None  # our writes wait on the client
        self._deadline: asyncio.TimerHandle | None = None
        self._write_deadline: asyncio.TimerHandle | None = None
        self._arm(self.header_timeout)
        if len(self.connections) > self.max_connections:
            self._shed()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._disarm_write()
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

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is None or self.cycle.response_complete:  # idle until the next request
            self._receiving = True
            self._waiting_since = time.monotonic()

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._stalled_since is None:
            self._stalled_since = time.monotonic()
            self._write_deadline = self.loop.call_later(self.write_timeout, self._not_reading)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._stalled_since = None
        self._disarm_write()

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._too_slow)

    def _disarm(self) -> None:
        deadline = getattr(self, "_deadline", None)  # None before connection_made
        if deadline is not None:
            deadline.cancel()
            self._deadline = None

    def _disarm_write(self) -> None:
        deadline = getattr(self, "_write_deadline", None)
        if deadline is not None:
            deadline.cancel()
            self._write_deadline = None

    def _too_slow(self) -> None:
        self._deadline = None
        if self._receiving and not self.transport.is_closing():
            self.transport.close()

    def _not_reading(self) -> None:
        self._write_deadline = None
        if self._stalled_since is not None:
            # abort, not close: close would wait, for ever, to flush what the client won't read
            self.transport.abort()

    def _shed(self) -> None:
        """Over the bound: close a connection in the order of the module's docstring."""
        others = [c for c in self.connections
                  if isinstance(c, GuardedProtocol) and c is not self
                  and not c.transport.is_closing()]
        stalled = [c for c in others if c._stalled_since is not None]
        if stalled:
            min(stalled, key=lambda c: c._stalled_since or 0.0).transport.abort()
            return
        waiting = [c for c in others if c._receiving]
        victim = min(waiting, key=lambda c: c._waiting_since) if waiting else self
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
        "write_timeout": settings.write_timeout_seconds,
        "max_connections": settings.max_connections,
    })


def uvicorn_config(app: Any, settings: Settings, host: str, port: int,
                   **kwargs: Any) -> uvicorn.Config:
    """uvicorn's config for the app. Proxy headers (``X-Forwarded-For``) are believed only
    from the proxies ``forwarded_allow_ips`` lists, and not at all by default: uvicorn's
    own default believes them from loopback, so any local process could claim any address
    and be a new source for every budget kept per source (notify/fairness.py)."""
    proxies = settings.forwarded_allow_ips
    return uvicorn.Config(app, host=host, port=port, http=protocol_class(settings),
                          timeout_keep_alive=5, proxy_headers=bool(proxies),
                          forwarded_allow_ips=",".join(proxies) if proxies else "", **kwargs)
