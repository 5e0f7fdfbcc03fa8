"""The durable outbox: at-least-once delivery with backoff, jitter, timeouts and rate limits.

Notifications are written to SQLite in the same transaction as the alert state that caused
them, so a crash loses nothing and a restart re-sends nothing that was confirmed. Each
channel has its own sender thread (a slow Slack never delays a page). This is the only
place that retries.

What a page can count on:

- **No head-of-line blocking.** Order is kept per alert, not per channel: a message waits
  only for earlier pending messages about one of its own alerts (a resolve never overtakes
  its trigger). A message that fails is retried on its backoff while the messages of other
  alerts and runs behind it go out; the due message that waited longest goes first.
- **Bounded time per attempt.** One attempt (connect, send, the whole answer) has
  ``attempt_timeout_seconds`` (``deadline.py``); a receiver that trickles its answer is
  cut off, and the attempt is a failed one with an error, a metric and the retry schedule.
- **Nothing dropped silently.** A message past ``max_age_seconds`` ends ``failed``
  whether or not it was ever tried; one that finds the queue full (``max_pending``, which
  bounds the disk and the sender's work when a receiver is down for long) is stored as
  ``failed`` with reason ``outbox_full``. Every end that is not ``sent`` is an ERROR log
  line, a count in ``monitor_agent_notifications_undelivered_total{channel,reason}`` and
  the delivery state ``GET /v1/alerts`` shows.
- **A flood cannot bury a page** (``fairness.py``). Among the messages due, critical news
  goes before error news and both before the rest; established runs' before new runs';
  then round robin between runs. New runs' pages are budgeted per channel and source,
  the rest folded into one summary per window, and the last share of ``max_pending`` is kept
  for established runs' pages: a made-up run id cannot take a real page's turn or room.

The outbox table lives in alerting's database (``alerting/db.py`` creates it, so a
notification commits with the alert state that caused it); all SQL on it is here. A SQLite
failure leaves as ``StorageError``: through ``Database``, or the caller's ``tx()`` for ``enqueue``.

The app calls ``start()`` (one sender thread per channel) and ``stop(timeout=5)``; here
nothing is started, and one ``deliver_next`` does what a sender does in its loop (to the
console, which needs no HTTP)::

    >>> import sys
    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.alerting.db import open_alert_db
    >>> from monitor_agent.notify.base import AlertEvent
    >>> from monitor_agent.notify.console import ConsoleNotifier
    >>> db, log = open_alert_db(":memory:"), logging.Logger("alerts")
    >>> log.addHandler(logging.StreamHandler(sys.stdout))
    >>> outbox = Outbox(db, {"console": ConsoleNotifier(log)}, OutboxSettings(),
    ...                 DeliveryMetrics(CollectorRegistry(), ["console"]), clock=lambda: 1000.0)
    >>> event = AlertEvent("ab12", "gpt-7", "TrainingNanInf", "nan_inf", "critical", "firing",
    ...                    "loss is NaN", started_at=990.0, step=300)
    >>> with db.tx() as conn:   # the transaction that changed the alert's state
    ...     outbox.enqueue(conn, "console", Notification("gpt-7", (event,), 1000.0), now=1000.0)
    True
    >>> with httpx.Client() as client:   # each sender thread holds one
    ...     outbox.deliver_next("console", client)   # 0.0: look again at once
    [FIRING:1] run gpt-7: TrainingNanInf
    - CRITICAL TrainingNanInf (run gpt-7, step 300): loss is NaN
    0.0
    >>> outbox.pending, outbox.delivery_states()["ab12"]["console"]["state"]
    (0, 'sent')
"""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from monitor_agent.metrics.delivery import DeliveryMetrics
from monitor_agent.notify.base import Notification, Notifier, Outcome, OutcomeKind
from monitor_agent.notify.channel_settings import OutboxSettings
from monitor_agent.notify.deadline import AttemptDeadline
from monitor_agent.notify.fairness import (
    LOWEST,
    NewRunBudget,
    Queued,
    is_news,
    order_key,
    priority,
    summary_fingerprint,
    summary_note,
)
from monitor_agent.records import wire
from monitor_agent.storage.database import Connection, Database

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Exponential backoff with jitter; a receiver's Retry-After wins (within a cap)."""

    base: float
    cap: float
    max_attempts: int
    max_age: float
    max_retry_after: float

    @classmethod
    def from_settings(cls, s: OutboxSettings) -> RetryPolicy:
        return cls(s.backoff_base_seconds, s.backoff_cap_seconds, s.max_attempts,
                   s.max_age_seconds, s.max_retry_after_seconds)

    def delay(self, attempts: int, retry_after: float | None, rand: float) -> float:
        """Seconds before the next try, after ``attempts`` failed ones (rand in [0, 1))."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        backoff = min(self.cap, self.base * 2 ** (attempts - 1))
        # Jitter in [backoff/2, backoff): sidecars that failed together do not retry together.
        return backoff * (0.5 + rand / 2)


def sendable(rows: list[Queued]) -> list[Queued]:
    """The rows (in id order) that no earlier row holds back: none of their alerts is in
    an earlier pending message. A row without fingerprints (queued by an older version)
    keeps its place behind every earlier such row.

        >>> rows = [Queued(1, 0.0, 3, 60.0, "a"), Queued(2, 0.0, 0, 0.0, "a"),
        ...         Queued(3, 0.0, 0, 0.0, "b c"), Queued(4, 0.0, 0, 0.0, "c")]
        >>> [row.id for row in sendable(rows)]   # 2 waits for 1 (its trigger), 4 for 3
        [1, 3]
    """
    held: set[str] = set()
    out = []
    for row in rows:
        keys = set((row.fingerprints or "").split()) or {""}
        if not keys & held:
            out.append(row)
        held |= keys
    return out


def _reason(outcome: Outcome) -> str:
    """The metric label for a permanent failure: 'http_404', or a bounded fallback."""
    if outcome.detail.startswith("internal error"):
        return "internal_error"
    code = outcome.detail[5:8] if outcome.detail.startswith("HTTP ") else ""
    return f"http_{code}" if code in ("400", "401", "403", "404", "410", "413") else "http_other"


class Outbox:
    """Queue in SQLite, one sender thread per channel."""

    def __init__(
        self,
        db: Database,
        notifiers: dict[str, Notifier],
        settings: OutboxSettings,
        metrics: DeliveryMetrics,
        clock: Callable[[], float] = time.time,
        transport: httpx.BaseTransport | None = None,
        rand: Callable[[], float] = random.random,
        redact: Callable[[str], str] = str,
    ) -> None:
        self.db = db
        self.notifiers = notifiers
        self.policy = RetryPolicy.from_settings(settings)
        self.max_pending = settings.max_pending
        # The last share of the cap: only established runs' pages and summaries use it.
        self.reserve = int(settings.max_pending * settings.reserved_for_pages)
        self.budget = NewRunBudget(settings.new_run_burst, settings.new_run_window_seconds)
        self.window = settings.new_run_window_seconds
        self.attempt_timeout = settings.attempt_timeout_seconds
        self.metrics = metrics
        self.clock = clock
        self.rand = rand
        self.redact = redact  # receivers echo requests: errors may quote a secret URL
        self._transport = transport
        self._wake = {name: threading.Event() for name in notifiers}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._last_send: dict[str, float] = {}
        # Per channel, run -> when its last message went out (the round robin), and per
        # (channel, source) when its next summary may be due.
        self._served: dict[str, dict[str, float]] = {name: {} for name in notifiers}
        self._next_summary: dict[tuple[str, str], float] = {}
        self._pending = self.db.query("SELECT COUNT(*) FROM outbox WHERE state = 'pending'")[0][0]
        metrics.pending.set(self._pending)

    # -- queue ----------------------------------------------------------------------------

    def enqueue(self, conn: Connection, channel: str, note: Notification, now: float,
                source: str | None = None) -> bool:
        """Add a notification inside the caller's transaction; False if the queue is full.

        ``source``: the notification is about alerts begun while their run was new, and
        the run came from there (None: an established run's). New runs' pages past the
        source's budget on this channel are folded into its summary; reminders,
        re-sends, acks and resolves of alerts that went out only in a summary are not sent
        (the summary told of them). A notification that finds no room is stored as
        already ``failed`` (reason ``outbox_full``), so its alerts show why nobody heard
        of them; only established runs' pages may use the last ``reserve`` places."""
        rank = priority(note)
        kept = self._unfolded(conn, channel, note)
        if kept is None:
            self.metrics.notifications.labels(channel=channel, outcome="summarised").inc()
            return True
        note = kept
        news = any(is_news(e) for e in note.events)
        if source is not None and rank < LOWEST and not self.budget.take(channel, source, now):
            return self._fold(conn, channel, note, source, rank, now)
        fingerprints = " ".join(e.fingerprint for e in note.events)
        if news:  # told one by one from now on: its follow-ups are sent too
            conn.executemany("DELETE FROM outbox_folded WHERE channel = ? AND fingerprint = ?",
                             [(channel, e.fingerprint) for e in note.events])
        limit = self.max_pending if source is None and rank < 2 else \
            self.max_pending - self.reserve
        if self._pending >= limit:
            self._refuse(conn, channel, note, now, fingerprints, limit)
            return False
        conn.execute(
            "INSERT INTO outbox (channel, body, created_at, next_at, fingerprints, priority, "
            "run_id, source) VALUES (?,?,?,?,?,?,?,?)",
            (channel, wire.dumps(note.to_dict()), now, now, fingerprints, rank, note.group,
             source),
        )
        self._queued(channel)
        return True

    def _queued(self, channel: str) -> None:
        self._set_pending(self._pending + 1)
        # Safe before the commit: the sender's read waits on the database lock that this
        # transaction holds, so it sees the row once committed.
        self._wake[channel].set()

    def _refuse(self, conn: Connection, channel: str, note: Notification, now: float,
                fingerprints: str, limit: int) -> None:
        error = f"outbox full ({self._pending} pending), max_pending={self.max_pending}"
        if limit < self.max_pending:
            error += (f"; the last {self.max_pending - limit} places are kept for pages of "
                      "established runs")
        conn.execute(
            "INSERT INTO outbox (channel, body, created_at, next_at, state, last_error, "
            "done_at, fingerprints, priority, run_id) VALUES (?,?,?,?,'failed',?,?,?,?,?)",
            (channel, wire.dumps(note.to_dict()), now, now, error, now, fingerprints,
             priority(note), note.group),
        )
        self.metrics.notifications.labels(channel=channel, outcome="dropped").inc()
        self.metrics.undelivered.labels(channel=channel, reason="outbox_full").inc()
        log.error("%s: NOT QUEUED, a %s notification for %s", error, channel, note.group)

    def _unfolded(self, conn: Connection, channel: str,
                  note: Notification) -> Notification | None:
        """``note`` without the follow-ups of alerts that went out only in a summary on
        this channel; None when nothing is left to send."""
        follow = [e.fingerprint for e in note.events if not is_news(e)]
        if not follow:
            return note
        folded = {r[0] for r in conn.execute(
            f"SELECT fingerprint FROM outbox_folded WHERE channel = ? AND fingerprint IN "
            f"({', '.join('?' * len(follow))})", (channel, *follow)).fetchall()}
        if not folded:
            return note
        events = tuple(e for e in note.events if is_news(e) or e.fingerprint not in folded)
        return dataclasses.replace(note, events=events) if events else None

    def _fold(self, conn: Connection, channel: str, note: Notification, source: str,
              rank: int, now: float) -> bool:
        """Fold a new run's news into the source's open summary on this channel (one is
        opened if none is: due at once, or a window after the previous one)."""
        found = conn.execute("SELECT id FROM outbox WHERE channel = ? AND source = ? AND "
                             "summary = 1 AND state = 'pending'", (channel, source)).fetchone()
        if found is not None:
            summary_id = found[0]
            conn.execute("UPDATE outbox SET priority = MIN(priority, ?) WHERE id = ?",
                         (rank, summary_id))
        else:
            if self._pending >= self.max_pending:
                self._refuse(conn, channel, note, now,
                             " ".join(e.fingerprint for e in note.events), self.max_pending)
                return False
            key = (channel, source)
            due = max(now, self._next_summary.get(key, now))
            # Its identity (its PagerDuty incident) is one per summary: the source's next
            # one is due a window after it, even when opened at the same moment (``now``
            # would name both, and PagerDuty would fold the second flood into the first).
            ident = summary_fingerprint(channel, source, repr(due))
            if len(self._next_summary) >= 10_000:  # made-up sources must not grow it
                self._next_summary = {k: t for k, t in self._next_summary.items() if t > now}
            self._next_summary[key] = due + self.window
            body = summary_note(source, [(e.run_id, e.alertname, e.severity)
                                         for e in note.events], ident, now, now,
                                self.budget.burst, self.window)
            summary_id = conn.execute(
                "INSERT INTO outbox (channel, body, created_at, next_at, fingerprints, "
                "priority, run_id, source, summary) VALUES (?,?,?,?,?,?,?,?,1)",
                (channel, wire.dumps(body.to_dict()), now, due, ident, rank, body.group,
                 source)).lastrowid
            self._queued(channel)
        conn.executemany(
            "INSERT OR REPLACE INTO outbox_folded (channel, fingerprint, summary_id, run_id, "
            "alertname, severity) VALUES (?,?,?,?,?,?)",
            [(channel, e.fingerprint, summary_id, e.run_id, e.alertname, e.severity)
             for e in note.events])
        self.metrics.notifications.labels(channel=channel, outcome="summarised").inc()
        return True

    def _set_pending(self, value: int) -> None:
        self._pending = value
        self.metrics.pending.set(value)

    @property
    def pending(self) -> int:
        return self._pending

    # -- delivery -------------------------------------------------------------------------

    def deliver_next(self, channel: str, client: httpx.Client) -> float | None:
        """Try the channel's sendable notification that goes first (``fairness.order_key``:
        severity, established runs, round robin between runs, due longest), if any is due.

        Returns seconds until something may be due again (0: go on now), None when empty.
        """
        now = self.clock()
        self._expire(channel, now)
        [(oldest, soonest)] = self.db.query(
            "SELECT MIN(created_at), MIN(next_at) FROM outbox "
            "WHERE channel = ? AND state = 'pending'", (channel,))
        self.metrics.oldest_pending.labels(channel=channel).set(
            0.0 if oldest is None else now - oldest)
        if soonest is None:
            return None
        ready = self._last_send.get(channel, 0.0) + self.notifiers[channel].min_interval
        if max(soonest, ready) > now:  # all in backoff (a receiver is down): skip the scan
            return max(soonest, ready) - now
        rows = [Queued(*r) for r in self.db.query(
            "SELECT id, created_at, attempts, next_at, fingerprints, priority, run_id, source, "
            "summary FROM outbox WHERE channel = ? AND state = 'pending' ORDER BY id",
            (channel,))]
        candidates = sendable(rows)
        due = [r for r in candidates if r.next_at <= now]
        if not due:
            return min(r.next_at for r in candidates) - now
        served = self._served[channel]
        row = min(due, key=lambda r: order_key(r, served))
        body = self._seal(row, now) if row.summary == 1 else \
            self.db.query("SELECT body FROM outbox WHERE id = ?", (row.id,))[0][0]
        if body is None:  # an emptied summary, taken out of the queue: the next row
            return 0.0
        outcome = self._attempt(channel, body, client)
        self._last_send[channel] = sent = self.clock()
        if len(served) >= 10_000:  # keep the runs served last; the others count as never
            for run in sorted(served, key=served.__getitem__)[:5_000]:
                del served[run]
        served[row.run_id or ""] = sent
        self._record(row, channel, outcome, self.clock())
        return 0.0

    def _seal(self, row: Queued, now: float) -> bytes | None:
        """A summary's first attempt: worded with every alert folded into it so far, and
        closed (what comes later opens the next one). The body it is sent with; None when
        every alert it held has been told one by one since (``enqueue``: news of an alert
        takes it out of its summary): nothing is left to say, and the summary is taken out
        of the queue rather than sent as a page of "0 new runs"."""
        with self.db.tx() as conn:
            folded = conn.execute(
                "SELECT run_id, alertname, severity FROM outbox_folded WHERE summary_id = ? "
                "ORDER BY rowid", (row.id,)).fetchall()
            if not folded:
                conn.execute("DELETE FROM outbox WHERE id = ?", (row.id,))
                self._set_pending(self._pending - 1)
                return None
            note = summary_note(row.source or "unknown", [tuple(r) for r in folded],
                                row.fingerprints or "", row.created_at, now,
                                self.budget.burst, self.window)
            body = wire.dumps(note.to_dict())
            conn.execute("UPDATE outbox SET body = ?, summary = 2 WHERE id = ?", (body, row.id))
        return body

    def _expire(self, channel: str, now: float) -> None:
        """End every pending message older than max_age, tried or not, queued behind
        another or not: a page nobody will hear of is a failure, not a pending one."""
        old = self.db.query(
            "SELECT id, attempts FROM outbox WHERE channel = ? AND state = 'pending' "
            "AND created_at < ?", (channel, now - self.policy.max_age))
        for row_id, attempts in old:
            self._finish(row_id, channel, "failed",
                         f"expired before delivery ({attempts} attempts)", now, reason="expired")

    def _attempt(self, channel: str, body: bytes, client: httpx.Client) -> Outcome:
        note = Notification.from_dict(wire.loads(body))
        t0 = time.perf_counter()
        try:
            with AttemptDeadline(client, self.attempt_timeout) as deadline:
                outcome = self.notifiers[channel].send(note, client)
        except Exception as exc:  # a bug in a payload builder must not kill the sender
            log.exception("%s notifier failed on %s", channel, note.group)
            return Outcome(OutcomeKind.PERMANENT, f"internal error: {type(exc).__name__}")
        finally:
            self.metrics.duration.labels(channel=channel).observe(time.perf_counter() - t0)
        if deadline.expired and outcome.kind is not OutcomeKind.OK:
            self.metrics.deadline_exceeded.labels(channel=channel).inc()
            return Outcome(OutcomeKind.RETRY, f"no complete answer within attempt_timeout_"
                                              f"seconds={self.attempt_timeout:g}")
        return outcome

    def _record(self, row: Queued, channel: str, outcome: Outcome, now: float) -> None:
        outcome = dataclasses.replace(outcome, detail=self.redact(outcome.detail))
        if outcome.kind is OutcomeKind.OK:
            self._finish(row.id, channel, "sent", None, now)
            return
        # A Retry-After answer (Slack's 429) is the receiver pacing us, not a failure: it
        # spends no attempt, so a long rate limit only ends at max_age.
        throttled = outcome.retry_after is not None
        attempts = row.attempts + (0 if throttled else 1)
        if outcome.kind is OutcomeKind.PERMANENT or attempts >= self.policy.max_attempts:
            reason = _reason(outcome) if outcome.kind is OutcomeKind.PERMANENT else "max_attempts"
            self._finish(row.id, channel, "failed", outcome.detail, now, reason=reason)
            return
        delay = self.policy.delay(attempts, outcome.retry_after, self.rand())
        with self.db.tx() as conn:
            conn.execute("UPDATE outbox SET attempts = ?, next_at = ?, last_error = ? WHERE id = ?",
                         (attempts, now + delay, outcome.detail, row.id))
        self.metrics.notifications.labels(channel=channel, outcome="retried").inc()
        log.info("%s delivery failed (%s); retry %d in %.1fs", channel, outcome.detail, attempts, delay)

    def _finish(self, row_id: int, channel: str, state: str, error: str | None, now: float,
                reason: str | None = None) -> None:
        with self.db.tx() as conn:
            conn.execute("UPDATE outbox SET state = ?, last_error = ?, done_at = ? WHERE id = ?",
                         (state, error, now, row_id))
            self._set_pending(self._pending - 1)
        self.metrics.notifications.labels(channel=channel, outcome=state).inc()
        if state == "failed":
            # A lost page: loud in the log, counted by reason, shown on GET /v1/alerts.
            self.metrics.undelivered.labels(channel=channel, reason=reason or "http_other").inc()
            log.error("%s notification %d NOT DELIVERED (%s): %s", channel, row_id, reason, error)

    def delivery_states(self) -> dict[str, dict[str, dict[str, object]]]:
        """fingerprint -> channel -> the latest notification's state, attempts and error;
        an alert folded into a summary has the summary's (``summarised``: true)."""
        rows = self.db.query(
            "SELECT id, channel, state, attempts, last_error, done_at, fingerprints, 0 "
            "FROM outbox WHERE fingerprints IS NOT NULL AND summary = 0 "
            "UNION ALL SELECT o.id, f.channel, o.state, o.attempts, o.last_error, o.done_at, "
            "f.fingerprint, 1 FROM outbox_folded f JOIN outbox o ON o.id = f.summary_id "
            "ORDER BY 1")
        out: dict[str, dict[str, dict[str, object]]] = {}
        for row in rows:
            view: dict[str, object] = {"state": row[2], "attempts": row[3],
                                       "last_error": row[4], "done_at": row[5]}
            if row[7]:
                view["summarised"] = True
            for fp in row[6].split():
                out.setdefault(fp, {})[row[1]] = view
        return out

    def prune(self, older_than: float) -> None:
        """Forget delivered and abandoned notifications finished before ``older_than``."""
        with self.db.tx() as conn:
            conn.execute("DELETE FROM outbox WHERE state != 'pending' AND done_at < ?", (older_than,))
            conn.execute("DELETE FROM outbox_folded WHERE summary_id NOT IN "
                         "(SELECT id FROM outbox)")

    # -- threads --------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        for channel in self.notifiers:
            t = threading.Thread(target=self._run, args=(channel,), daemon=True,
                                 name=f"notify-{channel}")
            t.start()
            self._threads.append(t)

    def _run(self, channel: str) -> None:
        wake = self._wake[channel]
        with httpx.Client(transport=self._transport) as client:
            while not self._stop.is_set():
                wake.clear()  # before looking, so an enqueue from now on is never missed
                try:
                    wait = self.deliver_next(channel, client)
                except Exception:
                    log.exception("%s sender error", channel)
                    wait = 1.0
                if wait is None or wait > 0:
                    # Woken early by a new notification or by stop().
                    wake.wait(1.0 if wait is None else min(wait, 1.0))

    def problem(self) -> str | None:
        """A sender thread that stopped while it should run (/readyz says so), or None."""
        if self._stop.is_set():
            return None
        dead = [t.name for t in self._threads if not t.is_alive()]
        return f"delivery: sender threads stopped: {', '.join(dead)}" if dead else None

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the senders; what is not delivered stays queued for the next start."""
        self._stop.set()
        for event in self._wake.values():
            event.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(deadline - time.monotonic(), 0.0))
        self._threads.clear()
