"""Runs engine calls on one dedicated thread, so engine state needs no locks.

The event loop never blocks on SQLite or detectors. HTTP handlers read engine state only
this way too (``queries.RunQueries``' methods), so a handler never sees a run half-way
through a batch.

**Fair between runs.** Calls wait in lanes, one per run (``lane=``: ingest passes the
batch's run id, a node sidecar's exchange about one run that run's) plus one for everything
else (reads, the tick, previews), and the thread
takes one call from each lane with work in turn: each lane's calls in submission order,
the lanes round robin, except ``FIRST``, whose calls go before any other lane's. One
first-in-first-out queue let a run that sends many requests at
once (256 ranks posting together, a client flooding) put all of them ahead of another
run's next batch, which then waited for every one; now it waits for at most one call of
each other lane with work queued. What one call may cost is bounded by the request limits
(``max_records_per_request``, ``max_body_bytes``) times the per-record bound of every
detector and ledger (docs/architecture.md, "What a record costs"): a call is not cut
short once it runs.

``FIRST`` is a node sidecar's link to its run leaders (serving/leader_link.py): reads and
deletes of its queue of digests, each bounded by ``batch_max_items``. An exchange makes a
few such calls one after another, and in a lane of their own each waited a turn of every
run's ingest: on a loaded node, seconds per exchange, so the leader heard the node late,
judged its view partial (no rule acts on a partial view) and decided on a view that lacked
the node's steps. The leader takes a node's exchange (api/peer.py) in the same lane: a node
not answered within its peer timeout pages on its own, as a partial view. The run's leader
is where its decisions are taken, so what feeds it goes first.

The app awaits ``runner.call(engine.ingest, items, now, lane=run_id)``; a call runs on the
engine thread, and ``submit`` serves code that has no event loop::

    >>> import asyncio, threading
    >>> runner = EngineRunner()
    >>> async def handler():
    ...     return await runner.call(lambda: threading.current_thread().name)
    >>> asyncio.run(handler())
    'engine_0'
    >>> runner.submit(sum, [1, 2, 3])
    6
    >>> runner.close()

Two lanes with work: they take turns (``a`` queued three calls before ``b`` queued one)::

    >>> runner, order, running, gate = EngineRunner(), [], threading.Event(), threading.Event()
    >>> hold = runner.submit_nowait(lambda: running.set() or gate.wait(), lane="a")
    >>> running.wait()  # the thread is busy: what follows queues up
    True
    >>> done = [runner.submit_nowait(order.append, x, lane=lane)
    ...         for x, lane in (("a1", "a"), ("a2", "a"), ("a3", "a"), ("b1", "b"))]
    >>> gate.set(); _ = [f.result() for f in done]; order
    ['a1', 'b1', 'a2', 'a3']
    >>> runner.close()

``FIRST`` goes before both::

    >>> runner, order, running, gate = EngineRunner(), [], threading.Event(), threading.Event()
    >>> hold = runner.submit_nowait(lambda: running.set() or gate.wait(), lane="a")
    >>> running.wait()
    True
    >>> done = [runner.submit_nowait(order.append, x, lane=lane) for x, lane in (
    ...     ("a1", "a"), ("b1", "b"), ("link1", FIRST), ("link2", FIRST))]
    >>> gate.set(); _ = [f.result() for f in done]; order
    ['link1', 'link2', 'a1', 'b1']
    >>> runner.close()
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any, TypeVar, TypeVarTuple

T = TypeVar("T")
Args = TypeVarTuple("Args")  # so mypy checks the arguments against ``fn``

_Call = tuple[Future[Any], Callable[..., Any], tuple[Any, ...]]

FIRST = ("runner", "first")
"""The lane served before every other (a node sidecar's link to its leaders: above)."""


class EngineRunner:
    """A single thread serving calls from lanes in turn, with an awaitable ``call``."""

    def __init__(self) -> None:
        self._lanes: dict[Hashable, deque[_Call]] = {}  # insertion order: whose turn next
        self._cv = threading.Condition()
        self._closed = False
        self._thread: threading.Thread | None = None  # started on the first call

    async def call(self, fn: Callable[[*Args], T], *args: *Args, lane: Hashable = None) -> T:
        return await asyncio.wrap_future(self.submit_nowait(fn, *args, lane=lane))

    def submit(self, fn: Callable[[*Args], T], *args: *Args, lane: Hashable = None) -> T:
        """Run from a non-async context and wait for the result."""
        return self.submit_nowait(fn, *args, lane=lane).result()

    def submit_nowait(self, fn: Callable[[*Args], T], *args: *Args,
                      lane: Hashable = None) -> Future[T]:
        """Queue a call in ``lane`` (None: the shared one); its future."""
        future: Future[T] = Future()
        with self._cv:
            if self._closed:
                raise RuntimeError("cannot schedule new calls after close")
            self._lanes.setdefault(lane, deque()).append((future, fn, args))
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="engine_0",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()
        return future

    def queued(self) -> int:
        """Calls waiting (not the one running)."""
        with self._cv:
            return sum(len(q) for q in self._lanes.values())

    def close(self) -> None:
        """Serve what is queued, then stop the thread."""
        with self._cv:
            self._closed = True
            self._cv.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._lanes and not self._closed:
                    self._cv.wait()
                if not self._lanes:
                    return
                lane = FIRST if FIRST in self._lanes else next(iter(self._lanes))
                calls = self._lanes.pop(lane)
                future, fn, args = calls.popleft()
                if calls:
                    self._lanes[lane] = calls  # to the back: the next lane's turn
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = fn(*args)
            except BaseException as exc:  # as concurrent.futures' workers do
                future.set_exception(exc)
            else:
                future.set_result(result)
