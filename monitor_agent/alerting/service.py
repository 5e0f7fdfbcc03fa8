"""``Alerting``: findings in, alerts out; the one object the engine and the API talk to.

``handle`` (engine thread, per record) matches rules, merges findings into alerts by
fingerprint and stores them as pending: a few SQLite statements, no network. A flusher
thread turns pending alerts into firing ones ``group_wait_seconds`` later, all alerts of a
run in one message; ``tick`` resolves, repeats and re-sends. Every message goes through the
durable outbox in the same transaction as the state change that caused it.

Example::

    alerting = Alerting(AlertingSettings(console={"enabled": True}), ":memory:", registry)
    alerting.start()
    alerting.handle(RunContext("r1"), [finding], now=time.time())
    alerting.tick(time.time())
    alerting.stop(timeout=5)
"""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from prometheus_client import CollectorRegistry

from monitor_agent import wire
from monitor_agent.alerting import actions
from monitor_agent.alerting import lifecycle as lc
from monitor_agent.alerting.actions import Action
from monitor_agent.alerting.admin import AlertAdmin, silenced_by
from monitor_agent.alerting.db import open_alert_db
from monitor_agent.alerting.events import dashboard_url, notifications, to_event
from monitor_agent.alerting.lifecycle import Reason
from monitor_agent.alerting.metrics import AlertingMetrics
from monitor_agent.alerting.model import RunContext
from monitor_agent.alerting.rules import Rule, first_match, load_rules
from monitor_agent.alerting.settings import AlertingSettings
from monitor_agent.alerting.silences import Silence
from monitor_agent.notify.base import AlertEvent
from monitor_agent.notify.channels import (
    ALL_CHANNELS,
    build_notifiers,
    channel_secrets,
    describe_channels,
)
from monitor_agent.notify.outbox import Outbox
from monitor_agent.notify.redact import SecretRedactor
from monitor_agent.types import Finding, Severity

log = logging.getLogger(__name__)
PRUNE_EVERY_S, KEEP_DONE_S = 600.0, 86400.0
Item = tuple[AlertEvent, tuple[str, ...]]


class Alerting(AlertAdmin):
    """Rules, lifecycle, silences and delivery, with state in its own SQLite database."""

    def __init__(
        self,
        settings: AlertingSettings,
        db_path: Path | str,
        registry: CollectorRegistry,
        clock: Callable[[], float] = time.time,
        http_transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings
        self.rules: list[Rule] = load_rules(settings.rules_file)
        self.notifiers = build_notifiers(settings)
        self.clock = clock
        self.metrics = AlertingMetrics(registry, ALL_CHANNELS)
        self.db = open_alert_db(db_path)
        # Stored errors are redacted here; log lines by the factory the app installs.
        self.redactor = SecretRedactor(self.secrets())
        self.outbox = Outbox(self.db, self.notifiers, settings.outbox, self.metrics, clock,
                             http_transport, redact=self.redactor.redact)
        self._flush_now = threading.Event()
        self._stopping = threading.Event()
        self._flusher: threading.Thread | None = None
        self._last_prune = 0.0

    def secrets(self) -> list[str]:
        """Every secret of the channels (URLs and keys), for redaction."""
        return channel_secrets(self.settings)

    # -- lifecycle of the service ---------------------------------------------------------

    def start(self) -> None:
        """Start delivery (one thread per channel) and the group flusher."""
        self._stopping.clear()
        line = describe_channels(self.settings, self.notifiers)
        # Louder when alerts would only reach this log (or nowhere): that is worth seeing.
        log.log(logging.INFO if "fallback" not in line and self.notifiers else logging.WARNING,
                "%s", line)
        # The app installs one for all its secrets; this covers Alerting used on its own.
        self.redactor.install()
        self.outbox.start()
        self._flusher = threading.Thread(target=self._flush_loop, daemon=True, name="alert-flush")
        self._flusher.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the threads; undelivered notifications stay in the outbox for next time."""
        self._stopping.set()
        self._flush_now.set()
        if self._flusher is not None:
            self._flusher.join(timeout)
        self.outbox.stop(timeout)
        self.redactor.uninstall()

    def _flush_loop(self) -> None:
        while not self._stopping.is_set():
            self._flush_now.clear()
            try:
                wait = self.flush(self.clock())
            except Exception:
                log.exception("alert flush failed")
                wait = 1.0
            self._flush_now.wait(1.0 if wait is None else min(max(wait, 0.001), 1.0))

    # -- findings -------------------------------------------------------------------------

    def handle(self, run: RunContext, findings: list[Finding], now: float) -> list[dict[str, Any]]:
        """Turn one record's findings into alert state; fast, no network.

        Returns the actions rules took (stop, checkpoint) as dicts, for the ingest response.
        """
        started, taken = False, []
        with self.db.tx() as conn:
            for finding in findings:
                began, action = self._one(conn, run, finding, now)
                started |= began
                if action is not None:
                    taken.append(action)
                    self._announce(conn, action, now)
        if started:
            self._flush_now.set()
        return [a.to_dict() for a in taken]

    def preview(self, run: RunContext, findings: list[Finding], now: float) -> int:
        """Begin alerts for the findings of a record sent ahead of its turn (a NaN step
        ahead of a backlog, see engine.preview); return how many began.

        Such an episode begins with ``count`` 0: no finding of it is counted yet. The
        record's in-order copy brings the same finding (same run, rule, rank: the same
        fingerprint) through ``handle`` later, which folds it in as the episode's first
        finding, so the page is not sent twice and ``action_after`` counts as it would
        have. An alert already pending or firing is left as it is; nothing here acts.
        """
        begun = 0
        with self.db.tx() as conn:
            for f in findings:
                rule = None if f.log_only else first_match(self.rules, f, run.match_labels())
                if rule is None:
                    continue
                identity = _identity(rule, f)
                fp = lc.fingerprint(run.run_id, rule.name, identity)
                row = conn.execute("SELECT * FROM alerts WHERE fingerprint = ?", (fp,)).fetchone()
                if row is None or lc.on_finding(_timing(row), f.step) is Reason.FIRST:
                    self._begin(conn, fp, run, rule, identity, f, now, count=0)
                    self._count(Reason.PREVIEWED)
                    begun += 1
        if begun:
            self._flush_now.set()
        return begun

    def _one(self, conn: sqlite3.Connection, run: RunContext, f: Finding,
             now: float) -> tuple[bool, Action | None]:
        rule = None if f.log_only else first_match(self.rules, f, run.match_labels())
        if rule is None:
            self._count(Reason.LOG_ONLY if f.log_only else Reason.UNMATCHED)
            return False, None
        identity = _identity(rule, f)
        fp = lc.fingerprint(run.run_id, rule.name, identity)
        row = conn.execute("SELECT * FROM alerts WHERE fingerprint = ?", (fp,)).fetchone()
        reason = lc.on_finding(_timing(row) if row else None, f.step)
        previewed = row is not None and row["count"] == 0 and row["state"] != "resolved"
        if previewed:  # the in-order copy of a previewed record: this episode's first
            reason = Reason.SUPPRESSED
        if reason is Reason.FIRST:
            self._begin(conn, fp, run, rule, identity, f, now)
            return True, self._act(conn, rule, f, fp, 1, now)
        if reason is Reason.SUPPRESSED:
            severity = row["severity"] if rule.severity else max(
                Severity.parse(row["severity"]), f.severity).label
            # Before the first page the episode's first finding is the news (the step it
            # began at); once firing, repeats tell the latest one.
            keep = (row["state"] == "pending" and severity == row["severity"]
                    and not previewed)
            finding = row["finding"] if keep else wire.dumps(f.to_dict())
            conn.execute(
                "UPDATE alerts SET last_seen = ?, last_step = MAX(COALESCE(last_step, ?), ?), "
                "count = count + 1, finding = ?, layer = ?, severity = ? WHERE fingerprint = ?",
                (now, f.step, f.step, finding, (row["layer"] or f.layer) if keep else f.layer,
                 severity, fp),
            )
            self._count(reason)
            return False, self._act(conn, rule, f, fp, row["count"] + 1, now)
        self._count(reason)
        return False, None

    def _act(self, conn: sqlite3.Connection, rule: Rule, f: Finding, fp: str, count: int,
             now: float) -> Action | None:
        if not actions.due(rule, count):
            return None
        action = actions.take(conn, rule, f, fp, now)
        log.warning("%s (run %s, %s)", action.message, f.run_id, f.type)
        return action

    def _announce(self, conn: sqlite3.Connection, action: Action, now: float) -> None:
        """People already paged about this alert hear of the action now, cooldown or not."""
        rows = conn.execute(
            "SELECT * FROM alerts WHERE run_id = ? AND rule = ? AND state = 'firing' "
            "AND notified = 'firing' AND action = ?",
            (action.run_id, action.rule, action.message)).fetchall()
        for row in rows:
            self._count(Reason.ACTION)
            self._enqueue(conn, [self._mark_sent(conn, row, Reason.ACTION, now)], now)

    def _begin(self, conn: sqlite3.Connection, fp: str, run: RunContext, rule: Rule,
               identity: dict[str, str], f: Finding, now: float, count: int = 1) -> None:
        """A new episode: pending until the group flush (the last page time is kept);
        ``count`` 0 for one begun by a preview (see ``preview``)."""
        link = dashboard_url(self.settings.grafana_url, run.run_id, f.time or now)
        values = dict(
            fingerprint=fp, run_id=run.run_id, rule=rule.name, type=f.type,
            severity=rule.severity_for(f).label, layer=f.layer, rank=f.rank,
            identity=json.dumps(identity), project=run.project, labels=json.dumps(run.labels),
            channels=json.dumps(rule.channels), cooldown=rule.cooldown,
            repeat_interval=rule.repeat_interval, resolve_after=rule.resolve_after,
            state="pending", started_at=now, pending_since=now, last_seen=now, last_step=f.step,
            count=count, resolved_at=None, acked_at=None, acked_by=None, dashboard_url=link,
            finding=wire.dumps(f.to_dict()), action=None,
        )
        cols = ", ".join(values)
        updates = ", ".join(f"{k} = excluded.{k}" for k in values if k != "fingerprint")
        conn.execute(
            f"INSERT INTO alerts ({cols}) VALUES ({', '.join('?' * len(values))}) "
            f"ON CONFLICT (fingerprint) DO UPDATE SET {updates}",
            tuple(values.values()),
        )

    # -- clock-driven work ----------------------------------------------------------------

    def flush(self, now: float) -> float | None:
        """Fire the runs whose group wait is over; return seconds until the next is due."""
        wait = self.settings.group_wait_seconds
        with self.db.tx() as conn:
            rows = conn.execute("SELECT * FROM alerts WHERE state = 'pending'").fetchall()
            by_run: dict[str, list[sqlite3.Row]] = {}
            for row in rows:
                by_run.setdefault(row["run_id"], []).append(row)
            due = {run: rs for run, rs in by_run.items()
                   if min(r["pending_since"] for r in rs) + wait <= now}
            silences = self._silences(conn, now)
            items = [item for rs in due.values() for r in rs
                     if (item := self._fire(conn, r, silences, now)) is not None]
            self._enqueue(conn, items, now)
        later = [min(r["pending_since"] for r in rs) + wait - now
                 for run, rs in by_run.items() if run not in due]
        return min(later) if later else None

    def _fire(self, conn: sqlite3.Connection, row: sqlite3.Row, silences: list[Silence], now: float) -> Item | None:
        reason = lc.on_flush(_timing(row), silenced_by(silences, row), now)
        self._count(reason)
        if reason is not Reason.FIRST:
            conn.execute("UPDATE alerts SET state = 'firing', pending_since = NULL, "
                         "notified = NULL WHERE fingerprint = ?", (row["fingerprint"],))
            return None
        return self._mark_sent(conn, row, reason, now)

    def tick(self, now: float) -> None:
        """Resolve, repeat, send what a silence or cooldown held back, re-send to Alertmanager."""
        self.flush(now)
        with self.db.tx() as conn:
            rows = conn.execute("SELECT * FROM alerts WHERE state = 'firing'").fetchall()
            silences = self._silences(conn, now)
            items: list[Item] = []
            for row in rows:
                reason = lc.on_tick(_timing(row), silenced_by(silences, row), now)
                if reason is not None:
                    self._count(reason)
                    if (item := self._transition(conn, row, reason, now)) is not None:
                        items.append(item)
            self._enqueue(conn, items, now)
            self._refresh(conn, rows, silences, now)
        if now - self._last_prune >= PRUNE_EVERY_S:
            self.outbox.prune(now - KEEP_DONE_S)
            self._last_prune = now

    def _transition(self, conn: sqlite3.Connection, row: sqlite3.Row, reason: Reason,
                    now: float) -> Item | None:
        if reason is not Reason.RESOLVED:
            return self._mark_sent(conn, row, reason, now)
        conn.execute("UPDATE alerts SET state = 'resolved', resolved_at = ? WHERE fingerprint = ?",
                     (now, row["fingerprint"]))
        if row["notified"] != "firing":
            return None  # nobody was told it fired (silenced throughout): close quietly
        conn.execute("UPDATE alerts SET notified = 'resolved' WHERE fingerprint = ?",
                     (row["fingerprint"],))
        return to_event(row, "resolved", reason.value, now), tuple(json.loads(row["channels"]))

    def _mark_sent(self, conn: sqlite3.Connection, row: sqlite3.Row, reason: Reason,
                   now: float) -> Item:
        conn.execute(
            "UPDATE alerts SET state = 'firing', pending_since = NULL, notified = 'firing', "
            "notified_at = ?, refreshed_at = ? WHERE fingerprint = ?",
            (now, now, row["fingerprint"]),
        )
        return to_event(row, "firing", reason.value, now), tuple(json.loads(row["channels"]))

    def _refresh(self, conn: sqlite3.Connection, rows: list[sqlite3.Row], silences: list[Silence],
                 now: float) -> None:
        """Channels that forget alerts unless re-told (Alertmanager) hear of firing ones again."""
        for name, notifier in self.notifiers.items():
            every = notifier.refresh_interval
            if every is None:
                continue
            stale = [r for r in rows if r["notified"] == "firing" and not silenced_by(silences, r)
                     and now - (r["refreshed_at"] or 0.0) >= every
                     and name in json.loads(r["channels"])]
            items = [(to_event(r, "firing", "refresh", now), (name,)) for r in stale]
            conn.executemany("UPDATE alerts SET refreshed_at = ? WHERE fingerprint = ?",
                             [(now, r["fingerprint"]) for r in stale])
            self._enqueue(conn, items, now)

    def delivery_states(self) -> dict[str, dict[str, dict[str, object]]]:
        """fingerprint -> channel -> how its latest notification went (GET /v1/alerts)."""
        return self.outbox.delivery_states()

    def check_writable(self) -> None:
        """Raise sqlite3.Error unless alert state can be made durable now (readiness)."""
        self.db.check_writable()

    def actions_for_run(self, run_id: str, after: int = 0, limit: int = 100) -> list[Action]:
        """Actions rules took for a run, ``id > after``, oldest first (the poll endpoint)."""
        return actions.actions_for_run(self.db, run_id, after, limit)

    def stop_requested(self, run_id: str) -> bool:
        return actions.stop_requested(self.db, run_id)

    def action_counts(self) -> dict[tuple[str, str, str], int]:
        """(run_id, action, rule) -> times taken; the exposition renders these."""
        return actions.action_counts(self.db)

    def run_ended(self, run_id: str, status: str, now: float, step: int | None = None) -> None:
        """A completed run resolves its alerts now; a failed one keeps them until clear.

        A ``stopped`` run at ``step`` honoured its stop requests there: the alerts that
        asked for it say so, and whoever was paged hears it (see alerting/actions.py).
        """
        if status == "stopped" and step is not None:
            with self.db.tx() as conn:
                for action in actions.honour_stops(conn, run_id, step):
                    log.warning("%s (run %s)", action.message, run_id)
                    self._announce(conn, action, now)
        if status != "completed":
            return
        self.flush(now + self.settings.group_wait_seconds)  # page what is pending first
        with self.db.tx() as conn:
            rows = conn.execute("SELECT * FROM alerts WHERE run_id = ? AND state = 'firing'",
                                (run_id,)).fetchall()
            items = [item for r in rows
                     if (item := self._transition(conn, r, Reason.RESOLVED, now)) is not None]
            for _ in rows:
                self._count(Reason.RESOLVED)
            self._enqueue(conn, items, now)

    # -- helpers --------------------------------------------------------------------------

    def _enqueue(self, conn: sqlite3.Connection, items: list[Item], now: float) -> None:
        for channel, note in notifications(items, self.notifiers, now):
            self.outbox.enqueue(conn, channel, note, now)

    def _count(self, reason: Reason) -> None:
        self.metrics.decisions.labels(reason=reason.value).inc()


def _identity(rule: Rule, f: Finding) -> dict[str, str]:
    values = {"layer": f.layer, "rank": str(f.rank)}
    return {k: v for k in rule.fingerprint if (v := values.get(k)) is not None}


def _timing(row: sqlite3.Row) -> lc.Timing:
    return lc.Timing(
        state=row["state"], notified=row["notified"], notified_at=row["notified_at"],
        last_seen=row["last_seen"], last_step=row["last_step"], acked=row["acked_at"] is not None,
        cooldown=row["cooldown"], repeat_interval=row["repeat_interval"],
        resolve_after=row["resolve_after"],
    )
