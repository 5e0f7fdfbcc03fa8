"""The background thread that turns records into batched POSTs, spooling what cannot go.

The training thread only calls ``submit`` (a non-blocking ``put`` on a bounded queue). The
sender thread drains the queue into batches (by count, bytes and a short linger time),
encodes them (turning pending device statistics into numbers first, see
``Monitor.log_step``) and posts them. A batch that cannot be delivered goes to the on-disk
spool, and while the spool holds anything, new batches queue up behind it there, so
delivery order is kept; the spool is replayed with exponential backoff and full jitter.
If the queue itself is full, the record is spooled straight away by the caller: nothing
is lost, but such records may reach the sidecar before older ones still in the queue (the
sidecar orders by step).

Example::

    sender = Sender(HttpTransport(url), Spool(tmpdir))
    sender.submit({"kind": "step", "run_id": "r", "step": 1, "time": 0.0})
    sender.flush(timeout=5.0)
    print(sender.counters())
"""

from __future__ import annotations

import collections
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from monitor_client.encode import dumps_line
from monitor_client.spool import Spool
from monitor_client.transport import HttpTransport, Outcome, PostResult
from monitor_client.warn import Warner


@dataclass(frozen=True)
class Counters:
    """What happened to the records handed to the client so far.

    Example::

        c = mon.counters(); assert c.dropped == 0
    """

    submitted: int
    sent: int          # stored or already stored (duplicates) by the sidecar
    spooled: int       # written to the disk spool at least once
    pending: int       # in the queue or in the spool, not yet acknowledged
    rejected: int      # refused by the sidecar (bad record); reasons were logged
    dropped: int       # lost: spool full, encoding failure, or a record too large to send


class Sender:
    """Background delivery of records; see the module docstring.

    Example::

        sender = Sender(HttpTransport("http://127.0.0.1:9400"), Spool("/tmp/s"))
    """

    def __init__(self, transport: HttpTransport, spool: Spool, *, max_queue: int = 10_000,
                 batch_records: int = 500, batch_bytes: int = 2 << 20, linger: float = 0.5,
                 backoff: tuple[float, float] = (0.5, 30.0), warner: Warner | None = None,
                 now: Callable[[], float] = time.monotonic,
                 on_actions: Callable[[list[dict]], None] | None = None,
                 poll: Callable[[], None] | None = None, poll_interval: float = 5.0) -> None:
        self.transport, self.spool = transport, spool
        # Actions (stop, checkpoint) come back in ingest answers; ``poll`` asks for them
        # every ``poll_interval`` s, for those another rank's records caused.
        self.on_actions, self.poll, self.poll_interval = on_actions, poll, poll_interval
        self._last_poll = now()
        self.batch_records, self.batch_bytes, self.linger = batch_records, batch_bytes, linger
        self.backoff = backoff
        self.warner = warner or Warner()
        self._now = now
        # A deque, not a queue.Queue: append/popleft are single GIL-atomic calls, so the
        # training thread never waits on a lock the sender thread may hold (a blocked
        # acquire hands the GIL over and costs a switch interval, ~5 ms, at p99).
        self._queue: collections.deque[Any] = collections.deque()
        self.max_queue = max_queue
        self._cond = threading.Condition()
        # Records a previous process left in this spool count as submitted: flush() then
        # waits for them too, and ``pending`` stays true.
        self._n = dict(submitted=len(spool), sent=0, spooled=0, rejected=0, dropped=0,
                       settled=0)
        self._failures, self._retry_at = 0, 0.0
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="monitor-client-sender",
                                        daemon=True)
        self._thread.start()

    # -- training-thread side -------------------------------------------------------------
    def submit(self, item: Any, urgent: bool = False) -> None:
        """Hand over a record (a dict, or an object with ``materialize() -> dict``).

        ``urgent`` sends without the linger: a NaN loss should reach the sidecar (and its
        ``stop`` come back) within a step, not a batch later.
        """
        # Only submit() writes "submitted" (no lock: see the deque above); readers under
        # the lock see a value at most one record old, which flush() tolerates.
        self._n["submitted"] += 1
        if self._stop.is_set():
            self._spool_lines(self._encode([item]))
            return
        queued = len(self._queue)
        if queued >= self.max_queue:
            self.warner.warn("queue_full", "send queue full; spooling records to %s",
                             self.spool.directory)
            self._spool_lines(self._encode([item]))
            return
        self._queue.append(item)
        if urgent or queued + 1 >= self.batch_records:
            self._wake.set()

    def counters(self) -> Counters:
        with self._cond:
            n = dict(self._n)
        return Counters(submitted=n["submitted"], sent=n["sent"], spooled=n["spooled"],
                        pending=n["submitted"] - n["settled"], rejected=n["rejected"],
                        dropped=n["dropped"])

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far was acknowledged (or given up on)."""
        deadline = self._now() + timeout
        with self._cond:
            target = self._n["submitted"]
            self._retry_at = 0.0  # a flush deserves a fresh attempt, not the backoff wait
            self._wake.set()
            while self._n["settled"] < target and self._thread.is_alive():
                left = deadline - self._now()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
                self._wake.set()
            return self._n["settled"] >= target

    def close(self, timeout: float = 10.0) -> bool:
        """Flush, then stop the thread; whatever is undelivered stays in the spool."""
        ok = self.flush(timeout)
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=max(1.0, self.transport.timeout[0] + 1.0))
        self._spool_lines(self._encode(self._drain_now()))
        self.spool.close()
        self.transport.close()
        return ok

    # -- sender-thread side ---------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._iteration()
            except Exception as exc:  # noqa: BLE001 - the thread must survive anything
                self.warner.warn("sender_bug", "sender error (continuing): %r", exc)
                time.sleep(0.1)

    def _iteration(self) -> None:
        items = self._collect()
        if items:
            self._deliver(self._encode(items))
        self._replay()
        self._maybe_poll()
        with self._cond:
            self._cond.notify_all()

    def _maybe_poll(self) -> None:
        if self.poll is None or self._now() - self._last_poll < self.poll_interval:
            return
        self._last_poll = self._now()
        if not len(self.spool) and self._now() >= self._retry_at:  # not while it is down
            self.poll()

    def _collect(self) -> list[Any]:
        # Sleep through the linger instead of waking per record: a sleeping sender does not
        # compete with the training thread for the GIL. submit() wakes us when a batch is
        # full or a record is urgent, flush() and close() when they are waiting.
        if len(self._queue) < self.batch_records:  # a backlog goes out without waiting
            self._wake.wait(0.05 if len(self.spool) else self.linger)
            self._wake.clear()
        return self._drain_now(self.batch_records)

    def _drain_now(self, limit: int = 1 << 30) -> list[Any]:
        items: list[Any] = []
        pop = self._queue.popleft
        while self._queue and len(items) < limit:
            items.append(pop())
        return items

    def _encode(self, items: list[Any]) -> list[bytes]:
        lines = []
        for item in items:
            try:
                record = item.materialize() if hasattr(item, "materialize") else item
                lines.append(dumps_line(record))
            except Exception as exc:  # noqa: BLE001 - a bad record must not stop the others
                self.warner.warn("encode", "could not encode a record, dropped: %r", exc)
                self._count(dropped=1, settled=1)
        return lines

    def _deliver(self, lines: list[bytes]) -> None:
        if len(self.spool) or self._now() < self._retry_at:
            self._spool_lines(lines)  # keep order: older records are waiting on disk
            return
        done = self._post_all(lines)
        self._spool_lines(lines[done:])

    def _replay(self) -> None:
        budget_end = self._now() + 1.0  # do not starve the queue while replaying
        while len(self.spool) and self._now() >= self._retry_at and self._now() < budget_end:
            lines = self.spool.peek(self.batch_records, self.batch_bytes)
            if not lines:
                return
            done = self._post_all(lines)
            self.spool.ack(done)
            if done < len(lines):
                return

    def _post_all(self, lines: list[bytes]) -> int:
        """Post ``lines`` in size-bounded chunks; return how many were settled, in order."""
        done = 0
        for chunk in _chunks(lines, self.batch_records, self.batch_bytes):
            settled = self._post_chunk(chunk)
            done += settled
            if settled < len(chunk):
                break
        return done

    def _post_chunk(self, chunk: list[bytes]) -> int:
        result = self.transport.post(chunk)
        if result.outcome is Outcome.TOO_LARGE and len(chunk) > 1:
            half = len(chunk) // 2
            first = self._post_chunk(chunk[:half])
            return first if first < half else first + self._post_chunk(chunk[half:])
        if result.outcome is Outcome.RETRY:
            self._schedule_retry(result)
            return 0
        self._settle(chunk, result)
        return len(chunk)

    def _settle(self, chunk: list[bytes], result: PostResult) -> None:
        self._failures = 0
        if result.outcome is Outcome.OK:
            if result.actions and self.on_actions is not None:
                self.on_actions(result.actions)
            for index, reason in result.rejected[:3]:
                self.warner.warn("rejected", "sidecar rejected record %d: %s", index, reason)
            self._count(sent=len(chunk) - len(result.rejected),
                        rejected=len(result.rejected), settled=len(chunk))
            return
        self.warner.warn("bad", "sidecar refused a batch of %d records (%s); dropped",
                         len(chunk), result.detail)
        self._count(dropped=len(chunk), settled=len(chunk))

    def _schedule_retry(self, result: PostResult) -> None:
        self._failures += 1
        base, cap = self.backoff
        delay = random.uniform(0, min(cap, base * 2 ** min(self._failures, 20)))
        self._retry_at = self._now() + delay
        self.warner.warn("retry", "sidecar unavailable (%s); spooling to %s, retrying",
                         result.detail, self.spool.directory)

    def _spool_lines(self, lines: list[bytes]) -> None:
        if not lines:
            return
        dropped = self.spool.append(lines)
        if dropped:
            self.warner.warn("spool_full", "spool %s full: %d step records dropped",
                             self.spool.directory, dropped)
        self._count(spooled=len(lines) - dropped, dropped=dropped, settled=dropped)

    def _count(self, **delta: int) -> None:
        with self._cond:
            for key, value in delta.items():
                self._n[key] += value
            self._cond.notify_all()


def _chunks(lines: list[bytes], max_records: int, max_bytes: int):
    chunk: list[bytes] = []
    size = 0
    for line in lines:
        if chunk and (len(chunk) >= max_records or size + len(line) > max_bytes):
            yield chunk
            chunk, size = [], 0
        chunk.append(line)
        size += len(line) + 1
    if chunk:
        yield chunk
