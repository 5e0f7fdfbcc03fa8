"""The background thread that turns records into batched POSTs, spooling what cannot go.

The training thread only calls ``submit`` (a non-blocking ``put`` on a bounded queue). The
sender thread drains the queue into batches (by count, bytes and a short linger time),
encodes them (turning pending device statistics into numbers first, see
``Monitor.log_step``) and posts them. A batch that cannot be delivered goes to the on-disk
spool, and while the spool holds anything, new batches queue up behind it there, so
delivery order is kept; the spool is replayed with exponential backoff and full jitter.
If the queue itself is full, the caller encodes the record and leaves it in an overflow
line behind the queue (as long again), which the sender takes once the queue before it is
drained: order is kept, because the sidecar stores a step older than its rank's latest as
late, without analysing it (its detectors only look forward). Only when the overflow is
full too is a record spooled straight away by the caller: nothing is lost, but it
overtakes the records still queued.

A NaN/Inf step does not wait for its page behind a backlog (``_alarming.py``): when it
has to be spooled, a *preview* copy of it goes to ``/v1/records/preview`` first (the sidecar
pages from it and stores nothing), and the sidecar is retried every second while it
waits; the record itself stays in its place and is delivered in order. Previews are best
effort: never spooled, dropped once answered or when the backlog holding their records
has been delivered, and switched off quietly by a sidecar without the route (404/405). A
preview the sidecar answers it cannot take yet, because it has no record of the run (the
process started while the sidecar was down, so the run record waits in the spool too), is
kept and sent again right after the next records got through: the first NaN step is the
one paged, not a later one previewed after the run was stored.

An answer no retry can fix (401/403 token, 404/405 path, an unusable URL; see
_transport.py) is logged once, as an error naming the URL and the fix, and the sender stops:
later records are counted as dropped, nothing more is spooled, and ``flush``/``close``
return at once.

Two records through a stand-in for ``HttpTransport`` that answers OK (the tests use a
loopback HTTP server, tests/client/conftest.py); ``close()`` stops the thread::

    >>> import tempfile
    >>> from types import SimpleNamespace
    >>> posted = []
    >>> ok = SimpleNamespace(base="stand-in", endpoint="stand-in", close=lambda: None,
    ...                      post=lambda lines: posted.extend(lines) or PostResult(PostOutcome.OK))
    >>> tmp = tempfile.TemporaryDirectory()
    >>> sender = Sender(ok, Spool(tmp.name))
    >>> sender.submit({"kind": "step", "run_id": "r", "step": 1, "time": 0.0})
    >>> sender.submit({"kind": "step", "run_id": "r", "step": 2, "time": 0.0, "loss": float("nan")})
    >>> sender.close()
    True
    >>> posted[1], sender.counters()
    (b'{"kind":"step","run_id":"r","step":2,"time":0.0,"loss":"NaN"}',
     Counters(submitted=2, sent=2, spooled=0, pending=0, rejected=0, dropped=0))
    >>> tmp.cleanup()
"""

from __future__ import annotations

import collections
import json
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from monitor_client._alarming import is_alarming
from monitor_client._counters import Counters
from monitor_client._encode import dumps_line
from monitor_client._spool import Spool
from monitor_client._transport import HttpTransport, PostOutcome, PostResult
from monitor_client._warn import LOGGER, Warner

MAX_PREVIEWS = 16  # waiting previews kept; later NaN steps of an outage page in order
HURRIED_POLL = 1.0
"""Seconds between two asks for the run's actions while the process reported itself
stuck (its watchdog's ``hang``): a stuck rank sends nothing, so a restart decided for it
reaches it only by a poll, and the job's relaunch waits for the last rank to leave. Once a
second, the watchdog's own wake: the default poll (5 s) added 0-5 s to every hang's
recovery; a stuck process's one small GET a second costs its sidecar nothing that
matters, and only while it is stuck."""


class Sender:
    """Background delivery of records; see the module docstring.

    An answer no retry can fix (here a wrong token) is logged once, as an error; the sender
    stops there, and ``flush`` answers False at once::

        >>> import tempfile
        >>> from types import SimpleNamespace
        >>> from monitor_client._transport import classify
        >>> wrong_token = SimpleNamespace(base="stand-in", endpoint="stand-in/v1/records",
        ...                               close=lambda: None, post=lambda lines: classify(401, b""))
        >>> tmp = tempfile.TemporaryDirectory()
        >>> sender = Sender(wrong_token, Spool(tmp.name))
        >>> sender.submit({"kind": "step", "run_id": "r", "step": 1, "time": 0.0})
        >>> sender.flush(), sender.misconfigured.fix
        (False, "the token is wrong or missing: ...")
        >>> sender.close(), sender.counters().dropped
        (False, 1)
        >>> tmp.cleanup()
    """

    def __init__(self, transport: HttpTransport, spool: Spool, *, max_queue: int = 10_000,
                 batch_records: int = 500, batch_bytes: int = 2 << 20, linger: float = 0.5,
                 backoff: tuple[float, float] = (0.5, 30.0), warner: Warner | None = None,
                 now: Callable[[], float] = time.monotonic,
                 on_actions: Callable[[list[dict]], None] | None = None,
                 poll: Callable[[], None] | None = None, poll_interval: float = 5.0,
                 hurry: Callable[[], bool] | None = None,
                 on_attempts: Callable[[list[dict]], None] | None = None,
                 name: str = "", owner: tuple[str, int] | None = None) -> None:
        self.transport, self.spool = transport, spool
        # Whose records the spool may hold, (run id, rank): a replay sends no other line.
        self.owner = owner
        # Whose records these are ("run 'gpt-7' rank 0"), for every message about the
        # spool: a user with a spool directory in hand must know which run it holds.
        self.name = name or "records"
        # Actions (stop, checkpoint) come back in ingest answers; ``poll`` asks for them
        # every ``poll_interval`` s, for those another rank's records caused.
        self.on_actions, self.poll, self.poll_interval = on_actions, poll, poll_interval
        # While ``hurry()`` (the process reported itself stuck: it sends nothing whose
        # answer could carry the restart that frees it), it asks every HURRIED_POLL s.
        self.hurry = hurry
        self.on_attempts = on_attempts  # which attempt of the run id took them (_attempt.py)
        self._last_poll = now()
        self.batch_records, self.batch_bytes, self.linger = batch_records, batch_bytes, linger
        self.backoff = backoff
        self.warner = warner or Warner()
        self._now = now
        # A deque, not a queue.Queue: append/popleft are single GIL-atomic calls, so the
        # training thread never waits on a lock the sender thread may hold (a blocked
        # acquire hands the GIL over and costs a switch interval, ~5 ms, at p99).
        self._queue: collections.deque[Any] = collections.deque()
        self._overflow: collections.deque[bytes] = collections.deque()  # encoded, see above
        self.max_queue = max_queue
        self._cond = threading.Condition()
        aged = spool.trim()
        if aged:
            self.warner.warn("spool_trim", "%s: spool %s: dropped the %d oldest records left "
                             "by an earlier process (older than max_age or over max_bytes)",
                             self.name, spool.directory, aged)
        # Records a previous process left in this spool count as submitted: flush() then
        # waits for them too, and ``pending`` stays true.
        self._n = dict(submitted=len(spool), sent=0, spooled=0, rejected=0, dropped=0,
                       settled=0)
        self._failures, self._retry_at = 0, 0.0
        # Copies of spooled alarming lines (non-finite loss/grad norm), sent ahead of the
        # backlog; ``_alarm_waiting`` while such a record is in the spool. See above.
        self._previews: collections.deque[bytes] = collections.deque()
        self.previews_on = True
        # The sidecar answered that it has not stored their run yet (this process started
        # while it was down: the run record waits in the spool too): sent again once
        # records got through, not popped, so the page names the first NaN step.
        self._previews_held = False
        self._alarm_waiting = False
        self.misconfigured: PostResult | None = None
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
        if self.misconfigured is not None:
            self._count(dropped=1, settled=1)
            return
        if self._stop.is_set():
            self._spool_lines(self._encode([item]))
            return
        queued = len(self._queue)
        if queued >= self.max_queue or self._overflow:  # once overflowing, all go behind
            self._overflowing(item)
            return
        self._queue.append(item)
        if urgent or queued + 1 >= self.batch_records:
            self._wake.set()

    def _overflowing(self, item: Any) -> None:
        alarming: list[int] = []
        lines = self._encode([item], alarming)
        if len(self._overflow) < self.max_queue:
            self.warner.warn("queue_full", "send queue full; records wait behind it")
            self._overflow.extend(lines)
        else:
            self.warner.warn("overflow_full", "send queue and its overflow full; spooling "
                             "records to %s ahead of the queued ones", self.spool.directory)
            self._spool_lines(lines)
        self._preview(lines, alarming)  # its page need not wait for the queue
        self._wake.set()

    def counters(self) -> Counters:
        with self._cond:
            n = dict(self._n)
        return Counters(submitted=n["submitted"], sent=n["sent"], spooled=n["spooled"],
                        pending=n["submitted"] - n["settled"], rejected=n["rejected"],
                        dropped=n["dropped"])

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything submitted so far was acknowledged (or given up on).

        False when that did not happen in ``timeout`` s, or when the sender stopped on a
        misconfiguration (nothing was delivered then)."""
        deadline = self._now() + timeout
        with self._cond:
            target = self._n["submitted"]
            self._retry_at = 0.0  # a flush deserves a fresh attempt, not the backoff wait
            self._wake.set()
            while (self._n["settled"] < target and self._thread.is_alive()
                   and self.misconfigured is None):
                left = deadline - self._now()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
                self._wake.set()
            return self._n["settled"] >= target and self.misconfigured is None

    def close(self, timeout: float = 10.0, max_extra: float = 60.0) -> bool:
        """Flush, then stop the thread; whatever is undelivered stays in the spool.

        When nothing answers it takes about ``timeout`` seconds in all: a request still in
        flight then is abandoned (the thread is a daemon) and its records are replayed from
        the spool by the next process with this run id, if any. A sidecar that keeps
        acknowledging records gets ``timeout`` more each time, up to ``max_extra`` s, so a
        backlog still drains at the end of a run.
        """
        start = self._now()
        end_by, give_up_at = start + timeout + max_extra, start + timeout
        before = self.counters().pending
        ok = self.flush(timeout)
        while not ok and self.misconfigured is None and self.counters().pending < before:
            before = self.counters().pending  # progress: the sidecar is answering
            give_up_at = min(self._now() + timeout, end_by)
            if give_up_at <= self._now():
                break
            ok = self.flush(give_up_at - self._now())
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=max(0.05, give_up_at - self._now()))
        self._spool_lines(self._encode(_pop(self._queue)) + _pop(self._overflow))
        # A still-running thread may yet write to the spool: only a stopped one lets go of it.
        self.spool.close(remove_if_empty=not self._thread.is_alive())
        left = self.counters().pending
        if not ok and left and self.misconfigured is None:
            LOGGER.warning("monitor_client: %s: the sidecar at %s did not acknowledge %d "
                           "records within %.1f s; they stay in the spool %s (a later Monitor "
                           "with this run id and rank sends them, or run: monitor-agent "
                           "push-spool %s --url %s)", self.name, self.transport.base, left,
                           timeout, self.spool.directory, self.spool.directory,
                           self.transport.base)
        if not self._thread.is_alive():
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
            self._deliver(items)
        elif self._overflow:  # the queue before it is drained: its turn, in order
            self._deliver_lines(_pop(self._overflow, self.batch_records), [])
        self._replay()
        self._maybe_poll()
        with self._cond:
            self._cond.notify_all()

    def _maybe_poll(self) -> None:
        interval = self.poll_interval
        if self.hurry is not None and self.hurry():
            interval = min(interval, HURRIED_POLL)
        if (self.poll is None or self.misconfigured is not None
                or self._now() - self._last_poll < interval):
            return
        self._last_poll = self._now()
        if not len(self.spool) and self._now() >= self._retry_at:  # not while it is down
            self.poll()

    def _collect(self) -> list[Any]:
        # Sleep through the linger instead of waking per record: a sleeping sender does not
        # compete with the training thread for the GIL. submit() wakes us when a batch is
        # full or a record is urgent, flush() and close() when they are waiting.
        if len(self._queue) < self.batch_records and not self._overflow:  # a backlog: no wait
            self._wake.wait(0.05 if len(self.spool) else self.linger)
            self._wake.clear()
        return _pop(self._queue, self.batch_records)

    def _encode(self, items: list[Any], alarming: list[int] | None = None) -> list[bytes]:
        """Encode records; ``alarming`` collects the indexes of NaN/Inf steps, if given."""
        lines: list[bytes] = []
        for item in items:
            try:
                record = item.materialize() if hasattr(item, "materialize") else item
                line = dumps_line(record)
            except Exception as exc:  # noqa: BLE001 - a bad record must not stop the others
                self.warner.warn("encode", "could not encode a record, dropped: %r", exc)
                self._count(dropped=1, settled=1)
                continue
            if alarming is not None and is_alarming(record):
                alarming.append(len(lines))
            lines.append(line)
        return lines

    def _deliver(self, items: list[Any]) -> None:
        alarming: list[int] = []
        lines = self._encode(items, alarming)
        self._deliver_lines(lines, alarming)

    def _deliver_lines(self, lines: list[bytes], alarming: list[int]) -> None:
        """Post ``lines`` or spool them behind a backlog; preview ``lines[i]`` for i in
        ``alarming`` when they have to wait."""
        if self.misconfigured is not None:
            self._spool_lines(lines)  # counted as dropped: nothing will take them
            return
        if len(self.spool) or self._now() < self._retry_at:
            self._spool_lines(lines)  # keep order: older records are waiting on disk
            self._preview(lines, alarming)
            return
        done = self._post_all(lines)
        self._spool_lines(lines[done:])
        self._preview(lines, [i for i in alarming if i >= done])

    def _preview(self, lines: list[bytes], alarming: list[int]) -> bool:
        """Queue preview copies of the spooled alarming ``lines[i]``; True if any."""
        if not alarming or self.misconfigured is not None:
            return False
        self._alarm_waiting = True
        self._retry_at = 0.0  # worth a fresh attempt now, even while backing off
        if self.previews_on:
            room = MAX_PREVIEWS - len(self._previews)  # the first NaN is the news
            self._previews.extend(lines[i] for i in alarming[:max(room, 0)])
        return True

    def _send_previews(self) -> None:
        """Post the waiting previews, ahead of the spool; one attempt per retry time.

        Those the sidecar could not take because it has no record of their run yet (its
        ``unknown_run``: the run record waits in the spool too) are kept, first in line,
        and sent again after the next records got through (``_settle``): popped, they
        would begin nothing, and a later NaN step previewed once the run is stored would
        begin the alert and name its own step instead of the first one."""
        if not self._previews or self._previews_held or self._now() < self._retry_at:
            return
        lines = list(self._previews)
        result = self.transport.preview(lines)
        if result.outcome is PostOutcome.RETRY:
            self._schedule_retry(result)
            return
        for _ in lines:
            self._previews.popleft()
        if result.outcome is PostOutcome.MISCONFIGURED:
            # A sidecar without the route (404/405), or a token the record stream will
            # report on its own: previews only, off quietly; records still go in order.
            self.previews_on = False
            self._previews.clear()
            LOGGER.info("monitor_client: no previews of NaN steps (%s); they are paged when "
                        "their turn comes", result.detail.strip()[:80])
        elif result.outcome is not PostOutcome.OK:
            self.warner.warn("preview", "sidecar refused a preview (%s)", result.detail)
        elif result.unknown_run:
            held = [lines[i] for i in sorted(set(result.unknown_run)) if 0 <= i < len(lines)]
            self._previews.extendleft(reversed(held))
            self._previews_held = bool(held)

    def _replay(self) -> None:
        if self.misconfigured is not None:
            return
        self._send_previews()
        if len(self.spool) and (dropped := self.spool.trim()):
            self._dropped_oldest(dropped)
        budget_end = self._now() + 1.0  # do not starve the queue while replaying
        while len(self.spool) and self._now() >= self._retry_at and self._now() < budget_end:
            lines = self.spool.peek(self.batch_records, self.batch_bytes)
            if not lines:
                return
            ours = [i for i, line in enumerate(lines) if self._ours(line)]
            done = self._post_all([lines[i] for i in ours])
            # Settled: every line before the first of ours not delivered (foreign ones too).
            settled = len(lines) if done == len(ours) else ours[done]
            if foreign := settled - done:
                self._foreign(foreign)
            self.spool.ack(settled)
            if settled < len(lines):
                return
            self._send_previews()  # held ones: their run record may just have been stored
        if not len(self.spool):  # every spooled alarming record was delivered in order
            self._alarm_waiting = False
            self._previews.clear()
            self._previews_held = False

    def _ours(self, line: bytes) -> bool:
        """Whether a spooled line is a record of this sender's own run and rank (a spool
        is replayed under this process's token: it sends no one else's records)."""
        if self.owner is None:
            return True
        try:
            record = json.loads(line)
        except ValueError:
            return False
        return (isinstance(record, dict) and record.get("run_id") == self.owner[0]
                and record.get("rank", 0) == self.owner[1])

    def _foreign(self, n: int) -> None:
        self.warner.warn("spool_foreign", "%s: spool %s held %d records of another run or "
                         "rank, or unreadable; not sent, dropped", self.name,
                         self.spool.directory, n)
        self._count(dropped=n, settled=n)

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
        if result.outcome is PostOutcome.TOO_LARGE and len(chunk) > 1:
            half = len(chunk) // 2
            first = self._post_chunk(chunk[:half])
            return first if first < half else first + self._post_chunk(chunk[half:])
        if result.outcome is PostOutcome.RETRY:
            self._schedule_retry(result)
            return 0
        if result.outcome is PostOutcome.MISCONFIGURED:
            self._give_up(result)
            return 0
        self._settle(chunk, result)
        return len(chunk)

    def _settle(self, chunk: list[bytes], result: PostResult) -> None:
        self._failures = 0
        if result.outcome is PostOutcome.OK:
            self._previews_held = False  # records got through: the run may be stored now
            if result.actions and self.on_actions is not None:
                self.on_actions(result.actions)
            if result.attempts and self.on_attempts is not None:
                self.on_attempts(result.attempts)
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
        if self._alarm_waiting:  # a NaN step is waiting: probe every second, not every 30
            delay = min(delay, 1.0)
        self._retry_at = self._now() + delay
        self.warner.warn("retry", "%s: sidecar unavailable (%s); spooling to %s, retrying",
                         self.name, result.detail, self.spool.directory)

    def _give_up(self, result: PostResult) -> None:
        """Say once, clearly, what is wrong; then stop trying (see the module docstring)."""
        if self.misconfigured is not None:
            return
        self.misconfigured = result
        LOGGER.error("monitor_client: cannot send records to %s (%s). Fix: %s. Monitoring is "
                     "off for the rest of this run; training is not affected.",
                     self.transport.endpoint, result.detail.strip(), result.fix)

    def _spool_lines(self, lines: list[bytes]) -> None:
        if not lines:
            return
        if self.misconfigured is not None:  # nothing will ever take them: do not pile up
            self._count(dropped=len(lines), settled=len(lines))
            return
        self._count(spooled=len(lines))
        dropped = self.spool.append(lines)
        if dropped:
            self._dropped_oldest(dropped)

    def _dropped_oldest(self, n: int) -> None:
        limit = f"{self.spool.max_bytes} bytes"
        if self.spool.max_age is not None:
            limit += f", {self.spool.max_age:g} s"
        self.warner.warn("spool_full", "%s: spool %s over its bounds (%s): dropped the %d "
                         "oldest records", self.name, self.spool.directory, limit, n)
        self._count(dropped=n, settled=n)

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


def _pop(queue: collections.deque[Any], limit: int = 1 << 30) -> list[Any]:
    """Up to ``limit`` items from the left of ``queue`` (the send queue or the overflow
    behind it); ``submit`` only appends, so a length seen here never shrinks under us."""
    items: list[Any] = []
    pop = queue.popleft
    while queue and len(items) < limit:
        items.append(pop())
    return items
