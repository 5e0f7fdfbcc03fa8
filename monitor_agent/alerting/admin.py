"""The API-facing half of ``Alerting``: listing alerts, silences and acknowledgements.

Example::

    alerting.add_silence(run_id="gpt-7", type="loss_spike", duration=3600, created_by="ana")
    alerting.acknowledge(fingerprint, by="ana")
    firing = alerting.list_alerts(state="firing")
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from monitor_agent.alerting import silences as sil
from monitor_agent.alerting.events import to_event
from monitor_agent.alerting.lifecycle import Reason
from monitor_agent.alerting.model import AlertView
from monitor_agent.alerting.silences import Silence

if TYPE_CHECKING:
    from monitor_agent.database import Database

STATES = ("pending", "firing", "resolved", "silenced")


class AlertAdmin:
    """Mixed into ``Alerting``; needs its ``db``, ``clock``, ``_enqueue`` and ``_count``."""

    db: Database
    clock: Callable[[], float]
    _enqueue: Callable[..., None]
    _count: Callable[[Reason], None]

    def list_alerts(self, state: str | None = None, run_id: str | None = None,
                    limit: int = 1000) -> list[AlertView]:
        """Newest first; ``state`` silenced means firing or pending under a silence."""
        sql, params = "SELECT * FROM alerts WHERE 1 = 1", []
        if state in ("pending", "firing", "resolved"):
            sql, params = sql + " AND state = ?", [state]
        elif state == "silenced":
            sql += " AND state != 'resolved'"
        if run_id is not None:
            sql, params = sql + " AND run_id = ?", [*params, run_id]
        rows = self.db.query(sql + " ORDER BY started_at DESC LIMIT ?", [*params, limit])
        views = self._views(rows)
        return [v for v in views if v.silenced] if state == "silenced" else views

    def active_alerts(self) -> list[AlertView]:
        """Pending and firing alerts (silenced ones included: they still fire)."""
        return self._views(self.db.query("SELECT * FROM alerts WHERE state != 'resolved'"))

    def alerts_for_run(self, run_id: str) -> list[AlertView]:
        return self.list_alerts(run_id=run_id)

    def _views(self, rows: list[sqlite3.Row]) -> list[AlertView]:
        active = self.silences()
        return [AlertView.from_row(r, silenced_by(active, r)) for r in rows]

    # -- silences -------------------------------------------------------------------------

    def add_silence(self, *, duration: float, comment: str = "", created_by: str = "",
                    **matchers: str | None) -> Silence:
        """Raises ValueError (with the fix) for a silence without matchers or duration."""
        silence = Silence.new(duration=duration, now=self.clock(), comment=comment,
                              created_by=created_by, **matchers)
        with self.db.tx() as conn:
            sil.insert(conn, silence)
        return silence

    def silences(self, include_expired: bool = False) -> list[Silence]:
        rows = self.db.query("SELECT * FROM silences ORDER BY created_at DESC")
        found = [sil.from_row(r) for r in rows]
        now = self.clock()
        return found if include_expired else [s for s in found if s.active(now)]

    def expire_silence(self, silence_id: str) -> bool:
        """End a silence now; False if there is no such active silence."""
        now = self.clock()
        with self.db.tx() as conn:
            cur = conn.execute("UPDATE silences SET ends_at = ? WHERE id = ? AND ends_at > ?",
                               (now, silence_id, now))
        return cur.rowcount > 0

    def _silences(self, conn: sqlite3.Connection, now: float) -> list[Silence]:
        rows = conn.execute("SELECT * FROM silences WHERE ends_at > ?", (now,)).fetchall()
        return [s for s in map(sil.from_row, rows) if s.active(now)]

    # -- acknowledgements -----------------------------------------------------------------

    def acknowledge(self, fingerprint: str, by: str) -> AlertView | None:
        """Someone owns it: no more reminders; channels that know acks (PagerDuty) hear it."""
        now = self.clock()
        with self.db.tx() as conn:
            conn.execute("UPDATE alerts SET acked_at = ?, acked_by = ? WHERE fingerprint = ?",
                         (now, by or "someone", fingerprint))
            row = conn.execute("SELECT * FROM alerts WHERE fingerprint = ?",
                               (fingerprint,)).fetchone()
            if row is None:
                return None
            self._count(Reason.ACKNOWLEDGED)
            if row["state"] == "firing" and row["notified"] == "firing":
                item = (to_event(row, "acknowledged", "acknowledged", now),
                        tuple(json.loads(row["channels"])))
                self._enqueue(conn, [item], now)
        return AlertView.from_row(row, silenced_by(self.silences(), row))


def silenced_by(active: list[Silence], row: sqlite3.Row) -> bool:
    return any(s.covers(**_alert_keys(row)) for s in active)


def _alert_keys(row: sqlite3.Row) -> dict[str, Any]:
    return {"run_id": row["run_id"], "type": row["type"], "alertname": row["rule"],
            "layer": row["layer"]}
