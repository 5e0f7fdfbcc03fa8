"""Runs engine calls on one dedicated thread, so engine state needs no locks.

The event loop never blocks on SQLite or detectors; calls are served in submission order.
HTTP handlers read engine state only this way too (``queries.RunQueries``' methods), so a
handler never sees a run half-way through a batch.

The app awaits ``runner.call(engine.ingest, items, now)``; a call runs on the engine
thread, and ``submit`` serves code that has no event loop::

    >>> import asyncio, threading
    >>> runner = EngineRunner()
    >>> async def handler():
    ...     return await runner.call(lambda: threading.current_thread().name)
    >>> asyncio.run(handler())
    'engine_0'
    >>> runner.submit(sum, [1, 2, 3])
    6
    >>> runner.close()
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar, TypeVarTuple

T = TypeVar("T")
Args = TypeVarTuple("Args")  # so mypy checks the arguments against ``fn``


class EngineRunner:
    """A single-thread executor with an awaitable ``call``."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine")

    async def call(self, fn: Callable[[*Args], T], *args: *Args) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, fn, *args)

    def submit(self, fn: Callable[[*Args], T], *args: *Args) -> T:
        """Run from a non-async context and wait for the result."""
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
