"""A page of stored JSON lines as a read answer whose memory is bounded by a constant.

Built whole, an answer of ``GET /v1/runs/{id}/records?limit=10000`` held every record
twice (its rows, then its JSON, made on the event loop): one such GET peaked +420 MB, and
thirty clients that sent it and never read the answer held 2.7 GB. Here an answer is

- a page: at most ``limit`` items and about ``read_page_bytes`` of stored bytes (it ends
  after the item that crosses it), then ``"next"``: the link to the following page (empty
  when this one ended with the last item), or null once the answer saw nothing follows;
- written as it is read, one chunk at a time: at most ``CHUNK_ROWS`` items and
  ``CHUNK_BYTES`` of stored bodies (or one item, when one is larger), turned into the
  answer's JSON in a worker thread (``wire.stored_to_wire``, no parsing) and handed to the
  connection only once the previous chunk has drained (uvicorn's send waits on the
  transport's flow control). A client that stops reading is dropped after
  ``write_timeout_seconds`` (serving/server.py).

So one answer holds one chunk: its stored bodies, their converted copy (a bare ``NaN``
grows by its quotes, at most 1.5 times), and that copy in the transport's buffer; at most
``4 x max(CHUNK_BYTES, max_record_bytes)`` = 16 MiB with the defaults, whatever is stored.
``ReadSlots`` lets ``max_read_streams`` (4) large answers be in progress at once: these, and
those built whole (``built_in_slot``: the charts, at most 16 MiB each as well, and the runs
page). One more page is answered 503 at once, so a waiting reader holds
nothing; with pages and charts, every large read answer together holds at most 64 MiB,
docs/hostile-input.md's budget for a request.

api/runs.py answers records and findings this way, api/alerts.py the alerts list. The
pieces of one answer, with a fetch that has two chunks of stored lines (one holding a bare
NaN) and a page of three items::

    >>> import asyncio
    >>> stored = [(1, b'{"loss": 2.5}'), (2, b'{"loss": NaN}'), (3, b'{"loss": 1.0}')]
    >>> async def fetch(after, max_rows, max_bytes):
    ...     rest = [row for row in stored if after is None or row[0] > after]
    ...     return rest[:min(max_rows, 2)]
    >>> async def answer(limit):
    ...     first = await fetch(None, limit, CHUNK_BYTES)  # what ``streamed`` does
    ...     page = Page(b'{"items": [', fetch, limit, 1 << 20, lambda key: f"?after={key}")
    ...     return b"".join([piece async for piece in page.pieces(first)])
    >>> asyncio.run(answer(limit=3))
    b'{"items": [{"loss": 2.5},{"loss": "NaN"},{"loss": 1.0}],"next":"?after=3"}'
    >>> asyncio.run(answer(limit=10))
    b'{"items": [{"loss": 2.5},{"loss": "NaN"},{"loss": 1.0}],"next":null}'
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import HTTPException
from fastapi.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from monitor_agent.records import tokens, wire

CHUNK_ROWS = 1000
CHUNK_BYTES = 256 * 1024
"""Small enough that a chunk of ordinary records costs little; a record larger than this
is a chunk of its own (its size is bounded by ``max_record_bytes``)."""

Rows = Sequence[tuple[Any, bytes]]
Fetch = Callable[[Any, int, int], Awaitable[Rows | None]]
"""``fetch(after, max_rows, max_bytes)``: the next items after key ``after`` (None: from the
start), as ``(key, stored body)``, at most ``max_rows`` and ``max_bytes`` (but at least one)."""


class ReadSlots:
    """How many large read answers may be in progress at once (one app's).

    A slot is held from before the answer is built until its last byte is handed to the
    connection (``StreamedAnswer`` gives it back), so an answer a client does not read
    keeps its slot until the write deadline drops it. Thread-safe: the chart routes take
    theirs in a worker thread."""

    def __init__(self, slots: int) -> None:
        self._free = threading.Semaphore(slots)

    def take(self, wait: float = 0.0) -> None:
        """Take a slot within ``wait`` seconds, or raise 503. The event loop passes 0: a
        waiting reader would hold its connection busy, where the cap cannot shed it."""
        if not self._free.acquire(blocking=wait > 0, timeout=wait if wait > 0 else None):
            raise HTTPException(
                503, "too many large reads in progress (max_read_streams); retry shortly",
                headers={"Retry-After": "1"})

    def give(self) -> None:
        self._free.release()


@dataclass(frozen=True, slots=True)
class Page:
    """One page of an answer: ``head`` + items joined by commas + ``"next"``."""

    head: bytes
    fetch: Fetch
    limit: int
    page_bytes: int
    link: Callable[[Any], str]
    records: bool = False  # stored records: their attempt tokens shown as digests

    async def pieces(self, first: Rows) -> AsyncIterator[bytes]:
        yield self.head
        rows, count, size, follows = first, 0, 0, None
        while rows:
            key = rows[-1][0]
            count += len(rows)
            size += sum(len(body) for _, body in rows)
            joined = await run_in_threadpool(_joined, [body for _, body in rows],
                                             count == len(rows), self.records)
            rows = ()  # the stored bodies are not needed while the client reads the chunk
            yield joined
            del joined
            if count >= self.limit or size >= self.page_bytes:
                follows = self.link(key)
                break
            rows = await self.fetch(key, min(self.limit - count, CHUNK_ROWS),
                                    min(CHUNK_BYTES, self.page_bytes - size)) or ()
        yield b'],"next":' + wire.dumps(follows) + b"}"


def _joined(bodies: list[bytes], first: bool, records: bool = False) -> bytes:
    out = b",".join([wire.stored_to_wire(body) for body in bodies])
    if records:  # a stored record's attempt token is a write capability: its digest
        out = tokens.redact(out)
    return out if first else b"," + out


class StreamedAnswer(StreamingResponse):
    """A JSON answer written as ``Page.pieces`` yields it; gives its read slot back when
    it ends, however it ends (read, dropped by the write deadline, or the client gone)."""

    def __init__(self, pieces: AsyncIterator[bytes], slots: ReadSlots) -> None:
        super().__init__(pieces, media_type="application/json")
        self._slots = slots

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._slots.give()


SLOT_WAIT = 2.0
"""Seconds an answer built whole (a chart, the runs page) waits for a read
slot: a page asks for several at once, each built in milliseconds, and should get them
all. A worker thread waits, never the event loop."""


def answered(slots: ReadSlots, body: bytes) -> StreamedAnswer:
    """An answer built whole in a slot the caller took, keeping it until the client has
    the answer."""
    async def whole() -> AsyncIterator[bytes]:
        yield body
    return StreamedAnswer(whole(), slots)


def built_in_slot(slots: ReadSlots, build: Callable[[], bytes]) -> StreamedAnswer:
    """(In a worker thread.) ``build()`` the answer in a read slot, kept until the client
    has it; 503 when no slot frees within ``SLOT_WAIT``."""
    slots.take(wait=SLOT_WAIT)
    try:
        return answered(slots, build())
    except BaseException:
        slots.give()
        raise


async def streamed(slots: ReadSlots, page: Page, start: Any, missing: str) -> StreamedAnswer:
    """The answer of ``page`` from key ``start``, in a read slot; 404 with ``missing`` when
    the first chunk is None (no such run): that must be known before the status line."""
    slots.take()
    try:
        rows = await page.fetch(start, min(page.limit, CHUNK_ROWS),
                                min(CHUNK_BYTES, page.page_bytes))
        if rows is None:
            raise HTTPException(404, missing)
        return StreamedAnswer(page.pieces(rows), slots)
    except BaseException:
        slots.give()
        raise
