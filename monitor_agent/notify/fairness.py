"""What goes first in the outbox, and what a flood of new runs gets instead of a page each.

Anyone who can write records can make up run ids, and each made-up run that sends a NaN
step pages like a real one. Without rules a thousand of them queue a thousand messages
ahead of the real page (Slack takes about one a second) or fill the outbox so the real
page is refused. So the outbox (``notify/outbox.py``) keeps four rules, the reasons in
docs/alerting.md ("What a flood cannot do"):

1. **Severity first.** A message is *news* when it tells of an alert firing (its first
   page, or an action taken); reminders, re-sends, acknowledgements and resolves are
   follow-ups. Critical news goes before error news, and both before everything else.
2. **Established runs before new ones.** Within a severity, messages about alerts of runs
   that reached the sidecar more than ``new_run_seconds`` before the episode began go
   first; a made-up run cannot be older than the flood that made it.
3. **Round robin between runs.** Then the run whose last message on the channel went out
   longest ago (or never) goes first, so one chatty run cannot hold back another run's
   first page; then the message due longest, as before.
4. **New runs' pages are budgeted per source.** Each channel sends ``new_run_burst``
   pages (error or critical news) about new runs of one source (the address that first
   sent the run) per ``new_run_window_seconds``; the rest are folded into one summary per
   window ("37 new runs paged within 12 s (TrainingNanInf x37): fake-1, fake-2, ..."),
   and their alerts' follow-ups are not sent one by one either: the summary told of them.
   New runs' warnings are not budgeted: rules 1 and 2 already put them last.

Plus the cap's reservation: the last ``reserved_for_pages`` share of ``max_pending`` is
kept for news of established runs' error and critical alerts, and for summaries.

The order of two due messages, a critical page of an established run ahead of a critical
page of a new one and of any warning::

    >>> rows = [Queued(1, 0.0, 0, 0.0, "w", PRIORITY["warning"], "gpt-1"),
    ...         Queued(2, 0.0, 0, 0.0, "n", PRIORITY["critical"], "fake-9", "10.0.0.7"),
    ...         Queued(3, 0.0, 0, 0.0, "r", PRIORITY["critical"], "gpt-2")]
    >>> [r.id for r in sorted(rows, key=lambda r: order_key(r, {}))]
    [3, 2, 1]

A burst of two per minute, then the third new run of that source is summarised::

    >>> budget = NewRunBudget(burst=2, window=60.0)
    >>> [budget.take("slack", "10.0.0.7", now) for now in (0.0, 1.0, 2.0)]
    [True, True, False]
    >>> budget.take("slack", "10.0.0.8", 2.0), budget.take("slack", "10.0.0.7", 61.0)
    (True, True)
    >>> note = summary_note("10.0.0.7", [("fake-1", "TrainingNanInf", "critical"),
    ...                                  ("fake-2", "TrainingNanInf", "critical")],
    ...                     "sum1", created_at=100.0, now=112.0, burst=2, window=60.0)
    >>> print(note.events[0].summary)
    2 new runs paged within 12 s (TrainingNanInf x2): fake-1, fake-2. New runs from 10.0.0.7 sent more than 2 pages in 60 s, so the rest are summarised here; GET /v1/alerts lists each
"""

from __future__ import annotations

import hashlib
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from monitor_agent.notify.base import AlertEvent, Notification

# Lower goes first. News of a critical alert, of an error, then everything else.
PRIORITY: dict[str, int] = {"critical": 0, "error": 1, "warning": 2, "info": 2}
LOWEST = 2
# Reasons a firing message is a follow-up, not news (alerting/lifecycle.py ``Reason``).
FOLLOW_UPS = frozenset({"repeat_elapsed", "refresh"})
SUMMARY_ALERTNAME = "NewRunsPaging"
SHOWN_RUNS = 20  # run ids a summary names; the rest are counted
UNKNOWN_SOURCE = "unknown"


@dataclass(frozen=True, slots=True)
class Queued:
    """A pending notification as the sender reads it (columns in SELECT order).

    ``priority``: 0 critical news, 1 error news, 2 the rest; ``run_id``: the run it is
    about; ``source``: set for a new run's message (where the run came from), None for an
    established run's."""

    id: int
    created_at: float
    attempts: int
    next_at: float
    fingerprints: str | None
    priority: int = 0
    run_id: str | None = None
    source: str | None = None
    summary: int = 0


def is_news(event: AlertEvent) -> bool:
    """An alert firing, as its first page or an action: not a reminder, re-send, ack or
    resolve."""
    return event.status == "firing" and event.reason not in FOLLOW_UPS


def priority(note: Notification) -> int:
    """0 for critical news, 1 for error news, 2 for anything else (warnings, follow-ups)."""
    return min((PRIORITY.get(e.severity, LOWEST) for e in note.events if is_news(e)),
               default=LOWEST)


def order_key(row: Queued, served: dict[str, float]) -> tuple[int, bool, float, float, int]:
    """The order among due messages: severity, established runs first, the run served
    longest ago (``served``: run -> when its last message on this channel went out), then
    the message due longest."""
    return (row.priority, row.source is not None, served.get(row.run_id or "", 0.0),
            row.next_at, row.id)


class NewRunBudget:
    """News about new runs: ``burst`` messages per channel and source per ``window``
    seconds (a sliding window); what is over it is summarised. In memory: a restart
    begins with the whole burst again."""

    def __init__(self, burst: int, window: float) -> None:
        self.burst = burst
        self.window = window
        self._sent: dict[tuple[str, str], deque[float]] = {}

    def take(self, channel: str, source: str, now: float) -> bool:
        """Whether one more message may go out on its own now (and count it if so)."""
        key = (channel, source)
        times = self._sent.get(key)
        if times is None:
            if len(self._sent) >= 10_000:  # made-up sources must not grow it for ever
                self._forget(now)
            times = self._sent[key] = deque()
        while times and times[0] <= now - self.window:
            times.popleft()
        if len(times) >= self.burst:
            return False
        times.append(now)
        return True

    def _forget(self, now: float) -> None:
        for key in [k for k, t in self._sent.items() if not t or t[-1] <= now - self.window]:
            del self._sent[key]


def summary_fingerprint(channel: str, source: str, ident: str) -> str:
    """A summary's own alert identity (its PagerDuty dedup key), one per summary."""
    return hashlib.sha256(f"{channel}\x1f{source}\x1f{ident}".encode()).hexdigest()[:24]


def summary_note(source: str, folded: Iterable[tuple[str, str, str]], ident: str,
                 created_at: float, now: float, burst: int, window: float) -> Notification:
    """One message for the alerts ``folded`` into a summary, as (run_id, alertname,
    severity): how many runs, which alerts, the first run ids; its severity the worst."""
    rows = list(folded)
    runs = list(dict.fromkeys(run for run, _, _ in rows))
    names = Counter(name for _, name, _ in rows)
    worst = min((sev for _, _, sev in rows), key=lambda s: PRIORITY.get(s, LOWEST),
                default="error")
    shown = ", ".join(runs[:SHOWN_RUNS]) + (f" and {len(runs) - SHOWN_RUNS} more"
                                            if len(runs) > SHOWN_RUNS else "")
    what = ", ".join(f"{name} x{n}" for name, n in names.most_common(5))
    span = max(now - created_at, 0.0)
    text = (f"{len(runs)} new runs paged within {span:.0f} s ({what}): {shown}. New runs "
            f"from {source} sent more than {burst} pages in {window:g} s, so the rest are "
            "summarised here; GET /v1/alerts lists each")
    group = f"new runs from {source}"
    event = AlertEvent(
        fingerprint=ident, run_id=group, alertname=SUMMARY_ALERTNAME, type="new_runs",
        severity=worst, status="firing", summary=text, started_at=created_at,
        reason="summary", count=len(rows),
        evidence={"new_runs": len(runs), "alerts": what, "runs": shown, "source": source},
        labels={"source": source})
    return Notification(group, (event,), now)
