"""Alert identity and the lifecycle decisions, as pure functions of state and a clock.

pending -> firing -> (repeat while firing) -> resolved. Every decision returns a ``Reason``
that the service counts in ``monitor_agent_alert_decisions_total``; nothing here reads a
clock or touches storage, so tests drive it with plain numbers.

A firing alert paged at t=100, last seen at step 10::

    >>> t = Timing(state="firing", notified="firing", notified_at=100.0, last_seen=100.0,
    ...            last_step=10, acked=False, cooldown=60, repeat_interval=3600, resolve_after=300)
    >>> on_finding(t, step=11), on_finding(t, step=9)   # a new finding; a replayed one
    (<Reason.SUPPRESSED: 'suppressed'>, <Reason.REPLAYED: 'replayed'>)
    >>> on_tick(t, silenced=False, now=200.0) is None   # seen lately, paged lately
    True
    >>> on_tick(t, silenced=False, now=400.0)           # clear for resolve_after
    <Reason.RESOLVED: 'resolved'>
    >>> fp = fingerprint("gpt-7", "TrainingNanInf", {"layer": "fc1"})   # an alert's identity
    >>> len(fp), fp == fingerprint("gpt-7", "TrainingNanInf", {"layer": "fc2"})
    (24, False)
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass


class Reason(enum.StrEnum):
    FIRST = "first"                    # a new alert: people hear of it now
    REPEAT_ELAPSED = "repeat_elapsed"  # still firing after the repeat interval: a reminder
    RESOLVED = "resolved"              # clear for resolve_after: closed, resolve sent
    SUPPRESSED = "suppressed"          # another finding of an alert already firing
    COOLDOWN = "cooldown"              # re-fired too soon after its last page: held
    SILENCED = "silenced"              # a silence covers it: recorded, not sent
    ACKNOWLEDGED = "acknowledged"      # someone owns it: no reminders
    REPLAYED = "replayed"              # a finding at or before one already handled
    LOG_ONLY = "log_only"              # the detector asked for no notification
    UNMATCHED = "unmatched"            # no rule matches the finding
    ACTION = "action"                  # a rule acted (stop, checkpoint): re-told at once
    PREVIEWED = "previewed"            # begun by a NaN step sent ahead of its backlog
    GROUPED = "grouped"                # follows from an open page: counted under it
    TOLD = "told_elsewhere"            # a node sidecar paged it while the run leader was away
    PARTIAL = "partial_view"           # made without the whole run in view: paged, no action
    HANDED_OVER = "handed_over"        # a node's partial-view page, now the run leader's to close


@dataclass(frozen=True, slots=True)
class Timing:
    """The part of an alert's stored state that decisions read."""

    state: str                  # pending | firing | resolved
    notified: str | None        # what people were last told: firing | resolved | None
    notified_at: float | None   # when the last firing message (first or repeat) went out
    last_seen: float
    last_step: int | None
    acked: bool
    cooldown: float
    repeat_interval: float
    resolve_after: float


def fingerprint(run_id: str, rule: str, identity: dict[str, str]) -> str:
    """Run + rule + the labels that matter: a storm of identical findings is one alert."""
    parts = [run_id, rule] + [f"{k}={identity[k]}" for k in sorted(identity)]
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:24]


def on_finding(alert: Timing | None, step: int) -> Reason:
    """A matching finding arrived: FIRST starts an episode (sent at the group flush)."""
    if alert is None:
        return Reason.FIRST
    last = alert.last_step if alert.last_step is not None else -1
    # Recovery replays stored records through the detectors after a restart; several
    # findings of one record share its step, so only an older step is a replay while firing.
    if step < last or (step == last and alert.state == "resolved"):
        return Reason.REPLAYED
    return Reason.FIRST if alert.state == "resolved" else Reason.SUPPRESSED


def on_flush(alert: Timing, silenced: bool, now: float, acted: bool = False) -> Reason:
    """May people hear of this firing alert now? FIRST, or why not (SILENCED, COOLDOWN).

    ``acted``: a rule took an action in this episode (a rollback, a stop): what was done to
    the run is told at once, cooldown or not, as it is to an alert already firing."""
    if silenced:
        return Reason.SILENCED
    if (not acted and alert.notified_at is not None
            and now - alert.notified_at < alert.cooldown):
        return Reason.COOLDOWN
    return Reason.FIRST


def on_tick(alert: Timing, silenced: bool, now: float) -> Reason | None:
    """Clock-driven transitions of a firing alert; None when nothing changes."""
    if alert.state != "firing":
        return None
    if now - alert.last_seen >= alert.resolve_after:
        return Reason.RESOLVED
    if alert.notified != "firing":
        # Held back by a silence or a cooldown: send once that is over.
        reason = on_flush(alert, silenced, now)
        return reason if reason is Reason.FIRST else None
    if silenced or alert.acked or alert.notified_at is None:
        return None
    if now - alert.notified_at >= alert.repeat_interval:
        return Reason.REPEAT_ELAPSED
    return None
