"""``AlertStore``: the one home of alert, silence and action state, and all its SQL.

Reads run on their own; writes that belong together (an alert's new state, the action
it took, the notification it causes) run inside one ``tx()``, whose ``AlertTx`` holds the
statements and exposes ``conn`` so the outbox can add its row to the same transaction.
Everything comes back as frozen dataclasses (``StoredAlert``, ``Silence``, ``Action``).
A SQLite failure leaves as ``StorageError``: reads and ``tx()`` go through ``Database``,
whose ``tx()`` converts whatever its body (the ``AlertTx`` statements) raised.

An episode begins pending and is paged in one transaction (``Episodes`` adds the
outbox's row with ``outbox.enqueue(tx.conn, ...)`` inside the same ``with``)::

    >>> from monitor_agent.alerting.db import open_alert_db
    >>> alerts = AlertStore(open_alert_db(":memory:"))
    >>> nan = StoredAlert(
    ...     fingerprint="ab12", run_id="gpt-7", rule="TrainingNanInf", type="nan_inf",
    ...     severity="critical", layer=None, rank=0, identity={}, project="gpt", labels={},
    ...     channels=("console",), cooldown=60.0, repeat_interval=3600.0, resolve_after=600.0,
    ...     state="pending", started_at=1000.0, pending_since=1000.0, last_seen=1000.0,
    ...     last_step=300, count=1, finding=b'{"message": "loss is NaN"}')
    >>> with alerts.tx() as tx:
    ...     tx.begin_episode(nan)
    ...     tx.mark_sent(nan.fingerprint, now=1001.0)
    >>> [(a.rule, a.state, a.notified, a.notified_at) for a in alerts.alerts(state="firing")]
    [('TrainingNanInf', 'firing', 'firing', 1001.0)]
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import astuple, fields, replace
from typing import Any

from monitor_agent.alerting.alerts import StoredAlert
from monitor_agent.alerting.silences import Silence
from monitor_agent.records.actions import Action, plan_of
from monitor_agent.records.types import Severity
from monitor_agent.storage.database import Connection, Database, Row

# What a new episode writes; the rest (what people were last told, and when) is kept
# from an earlier episode of the same fingerprint, so its cooldown still counts.
_KEPT = ("notified", "notified_at", "refreshed_at")
_EPISODE = tuple(f.name for f in fields(StoredAlert) if f.name not in _KEPT)
_JSON = ("identity", "labels", "channels")


def _alert(row: Row) -> StoredAlert:
    values = {k: row[k] for k in row.keys()}  # noqa: SIM118 (a Row iterates its values)
    values["identity"], values["labels"] = json.loads(row["identity"]), json.loads(row["labels"])
    values["channels"] = tuple(json.loads(row["channels"]))
    return StoredAlert(**values)


def _silence(row: Row) -> Silence:
    return Silence(**{k: row[k] for k in row.keys()})  # noqa: SIM118 (a Row iterates its values)


def _action(row: Row) -> Action:
    plan = plan_of(row["action"], json.loads(row["plan"])) if row["plan"] else None
    return Action(id=row["seq"], run_id=row["run_id"], action=row["action"], rule=row["rule"],
                  type=row["type"], step=row["step"], message=row["message"],
                  created_at=row["created_at"], honoured_step=row["honoured_step"], plan=plan,
                  withdrawn_by=row["withdrawn_by"])


def _plan_json(action: Action) -> str | None:
    """The plan as stored (``actions.plan``): its JSON, keys sorted."""
    return None if action.plan is None else json.dumps(action.plan.to_dict(), sort_keys=True)


_MAX_KNOWN_RUNS = 10_000


class AlertStore:
    """Alerts, silences and actions in alerting's database (``alerting/db.py``)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        # Runs known to hold no action past an id (run -> (id, generation)), as of the
        # actions' generation, which every commit that adds one moves on: a run's leader
        # answers each node's exchange, a hundred a second, with the actions it has not
        # seen, and nearly always there are none; it knows so without a query.
        self._generation = 0
        self._none_after: dict[str, tuple[int, int]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def tx(self) -> Iterator[AlertTx]:
        """One transaction: every write through the ``AlertTx`` commits together."""
        with self.db.tx() as conn:
            tx = AlertTx(conn)
            yield tx
        if tx.added_actions:
            self._actions_added()

    def _actions_added(self) -> None:
        with self._lock:
            self._generation += 1

    # -- alerts ---------------------------------------------------------------------------

    def alerts(self, state: str | None = None, run_id: str | None = None, limit: int = 1000,
               *, unresolved: bool = False,
               before: tuple[float, str] | None = None) -> list[StoredAlert]:
        """Newest first (then by fingerprint, so the order is total); ``state`` one of
        pending, firing, resolved (else any), or ``unresolved``: pending and firing;
        ``before``: only those after this ``(started_at, fingerprint)`` in that order."""
        sql, params = "SELECT * FROM alerts WHERE 1 = 1", list[Any]()
        if state in ("pending", "firing", "resolved"):
            sql, params = sql + " AND state = ?", [state]
        elif unresolved:
            sql += " AND state != 'resolved'"
        if run_id is not None:
            sql, params = sql + " AND run_id = ?", [*params, run_id]
        if before is not None:
            sql, params = sql + " AND (started_at, fingerprint) < (?, ?)", [*params, *before]
        rows = self.db.query(sql + " ORDER BY started_at DESC, fingerprint DESC LIMIT ?",
                             [*params, limit])
        return [_alert(r) for r in rows]

    def active(self) -> list[StoredAlert]:
        """Pending and firing alerts, in storage order."""
        return [_alert(r) for r in self.db.query("SELECT * FROM alerts WHERE state != 'resolved'")]

    # -- silences -------------------------------------------------------------------------

    def silences(self) -> list[Silence]:
        """Every silence, expired ones too, newest first."""
        rows = self.db.query("SELECT * FROM silences ORDER BY created_at DESC")
        return [_silence(r) for r in rows]

    def silences_page(self, active_at: float | None, before: tuple[float, str] | None,
                      limit: int) -> list[Silence]:
        """A page of ``GET /v1/silences``: newest first, after ``before`` ((created_at, id)),
        at most ``limit``; only those in force at ``active_at`` unless it is None."""
        sql = "SELECT * FROM silences WHERE 1"
        params: list[Any] = []
        if active_at is not None:
            sql += " AND ends_at > ?"
            params.append(active_at)
        if before is not None:
            sql += " AND (created_at, id) < (?, ?)"
            params.extend(before)
        rows = self.db.query(sql + " ORDER BY created_at DESC, id DESC LIMIT ?", [*params, limit])
        return [_silence(r) for r in rows]

    def add_silence(self, s: Silence) -> None:
        with self.tx() as tx:
            tx.conn.execute(
                "INSERT INTO silences (id, run_id, type, alertname, layer, comment, created_by, "
                "created_at, ends_at) VALUES (?,?,?,?,?,?,?,?,?)",
                (s.id, s.run_id, s.type, s.alertname, s.layer, s.comment, s.created_by,
                 s.created_at, s.ends_at),
            )

    def expire_silence(self, silence_id: str, now: float) -> bool:
        """End a silence now; False if there is no such active silence."""
        with self.tx() as tx:
            cur = tx.conn.execute("UPDATE silences SET ends_at = ? WHERE id = ? AND ends_at > ?",
                                  (now, silence_id, now))
        return cur.rowcount > 0

    # -- actions --------------------------------------------------------------------------

    def actions_for_run(self, run_id: str, after: int = 0, limit: int = 100) -> list[Action]:
        """A run's actions with ``id > after``, oldest first (an action's id is its number
        within its run)."""
        generation = self._generation  # before the query: an action added meanwhile moves it
        rows = self.db.query("SELECT * FROM actions WHERE run_id = ? AND seq > ? ORDER BY seq "
                             "LIMIT ?", (run_id, after, limit))
        if not rows:
            seen = self._none_after.get(run_id)
            if seen is None or seen[1] != generation or after < seen[0]:
                if len(self._none_after) >= _MAX_KNOWN_RUNS:
                    self._none_after.clear()  # made-up run ids must not grow it forever
                self._none_after[run_id] = (after, generation)
        return [_action(r) for r in rows]

    def no_actions_after(self, run_id: str, after: int) -> bool:
        """Whether ``actions_for_run(run_id, after)`` is known to be empty, without a query
        (False: ask it)."""
        seen = self._none_after.get(run_id)
        return seen is not None and seen[1] == self._generation and after >= seen[0]

    def adopt(self, run_id: str, actions: Sequence[Action], origin: str) -> list[Action]:
        """Keep the actions the run's leader decided (monitor_agent/cluster), under the
        leader's ids, for this sidecar's ranks to read; an honoured one updates the copy.
        Returns those that were new here."""
        fresh = []
        with self.db.tx() as conn:
            for a in actions:
                plan = _plan_json(a)
                known = conn.execute("SELECT 1 FROM actions WHERE run_id = ? AND seq = ?",
                                     (run_id, a.id)).fetchone()
                conn.execute(
                    "INSERT INTO actions (run_id, seq, origin, action, rule, type, step, "
                    "fingerprint, message, created_at, honoured_step, plan, withdrawn_by) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?) "
                    "ON CONFLICT (run_id, seq) DO UPDATE SET message = excluded.message, "
                    "honoured_step = COALESCE(actions.honoured_step, excluded.honoured_step), "
                    "withdrawn_by = COALESCE(actions.withdrawn_by, excluded.withdrawn_by)",
                    (run_id, a.id, origin, a.action, a.rule, a.type, a.step, a.message,
                     a.created_at, a.honoured_step, plan, a.withdrawn_by))
                if known is None:
                    fresh.append(a)
        if fresh:
            self._actions_added()
        return fresh

    def stop_requested(self, run_id: str) -> bool:
        """Whether any rule ever asked this run to stop."""
        return bool(self.db.query(
            "SELECT 1 FROM actions WHERE run_id = ? AND action = 'stop' LIMIT 1", (run_id,)))

    def action_counts(self) -> dict[tuple[str, str, str], int]:
        """(run_id, action, rule) -> how many times it was taken, for the exposition."""
        rows = self.db.query("SELECT run_id, action, rule, COUNT(*) AS n FROM actions "
                             "GROUP BY run_id, action, rule")
        return {(r["run_id"], r["action"], r["rule"]): r["n"] for r in rows}


class AlertTx:
    """The writes (and the reads they depend on) inside one ``AlertStore.tx()``."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn  # for the outbox's row in the same transaction
        self.added_actions = False

    def _alerts(self, where: str, params: Sequence[object] = ()) -> list[StoredAlert]:
        return [_alert(r) for r in self.conn.execute(f"SELECT * FROM alerts WHERE {where}",
                                                     params).fetchall()]

    def alert(self, fingerprint: str) -> StoredAlert | None:
        found = self._alerts("fingerprint = ?", (fingerprint,))
        return found[0] if found else None

    def in_state(self, state: str, run_id: str | None = None) -> list[StoredAlert]:
        if run_id is None:
            return self._alerts("state = ?", (state,))
        return self._alerts("run_id = ? AND state = ?", (run_id, state))

    def paged_with_action(self, run_id: str, rule: str, action: str) -> list[StoredAlert]:
        """Firing alerts of a rule whose page went out and that carry ``action``."""
        return self._alerts("run_id = ? AND rule = ? AND state = 'firing' "
                            "AND notified = 'firing' AND action = ?", (run_id, rule, action))

    def begin_episode(self, alert: StoredAlert) -> None:
        """Insert a new alert, or start a new episode of a resolved (or previewed) one."""
        values = dict(zip((f.name for f in fields(StoredAlert)), astuple(alert), strict=True))
        for k in _JSON:
            values[k] = json.dumps(values[k])
        cols = ", ".join(_EPISODE)
        updates = ", ".join(f"{k} = excluded.{k}" for k in _EPISODE if k != "fingerprint")
        self.conn.execute(
            f"INSERT INTO alerts ({cols}) VALUES ({', '.join('?' * len(_EPISODE))}) "
            f"ON CONFLICT (fingerprint) DO UPDATE SET {updates}",
            tuple(values[k] for k in _EPISODE),
        )

    def merge_finding(self, fingerprint: str, now: float, step: int, finding: bytes,
                      layer: str | None, severity: str) -> None:
        """Another finding of an open episode: seen now, counted, ``finding`` kept as news."""
        self.conn.execute(
            "UPDATE alerts SET last_seen = ?, last_step = MAX(COALESCE(last_step, ?), ?), "
            "count = count + 1, finding = ?, layer = ?, severity = ? WHERE fingerprint = ?",
            (now, step, step, finding, layer, severity, fingerprint),
        )

    def open_pages(self, run_id: str) -> list[StoredAlert]:
        """A run's pending and firing alerts, most severe first (then the earliest)."""
        found = self._alerts("run_id = ? AND state != 'resolved'", (run_id,))
        return sorted(found, key=lambda a: (-Severity.parse(a.severity), a.started_at))

    def set_related(self, fingerprint: str, related: str) -> None:
        """The findings grouped under an alert (alerting/related.py's JSON)."""
        self.conn.execute("UPDATE alerts SET related = ? WHERE fingerprint = ?",
                          (related, fingerprint))

    def resolved_elsewhere(self, fingerprint: str) -> None:
        """People were told this episode resolved, by the node sidecar that paged it."""
        self.conn.execute("UPDATE alerts SET resolved_elsewhere = 1 WHERE fingerprint = ?",
                          (fingerprint,))

    def fire_quietly(self, fingerprint: str) -> None:
        """Firing, but nobody told (a silence or cooldown holds it): ``tick`` sends later."""
        self.conn.execute("UPDATE alerts SET state = 'firing', pending_since = NULL, "
                          "notified = NULL WHERE fingerprint = ?", (fingerprint,))

    def newcomers(self, fingerprints: Sequence[str]) -> dict[str, str]:
        """fingerprint -> the source of its run, for the alerts begun while their run was
        new (``StoredAlert.newcomer``); established runs' alerts are left out."""
        out: dict[str, str] = {}
        unique = list(dict.fromkeys(fingerprints))
        for i in range(0, len(unique), 500):
            chunk = unique[i:i + 500]
            rows = self.conn.execute(
                f"SELECT fingerprint, newcomer FROM alerts WHERE newcomer IS NOT NULL AND "
                f"fingerprint IN ({', '.join('?' * len(chunk))})", chunk).fetchall()
            out.update((r[0], r[1]) for r in rows)
        return out

    def mark_sent(self, fingerprint: str, now: float) -> None:
        """Firing, and people are told now (first page, repeat, or an action)."""
        self.conn.execute(
            "UPDATE alerts SET state = 'firing', pending_since = NULL, notified = 'firing', "
            "notified_at = ?, refreshed_at = ? WHERE fingerprint = ?", (now, now, fingerprint))

    def resolve(self, fingerprint: str, now: float, told: bool) -> None:
        """Closed at ``now``; ``told``: the resolve message goes out with it."""
        self.conn.execute("UPDATE alerts SET state = 'resolved', resolved_at = ? "
                          "WHERE fingerprint = ?", (now, fingerprint))
        if told:
            self.conn.execute("UPDATE alerts SET notified = 'resolved' WHERE fingerprint = ?",
                              (fingerprint,))

    def refreshed(self, fingerprints: Sequence[str], now: float) -> None:
        self.conn.executemany("UPDATE alerts SET refreshed_at = ? WHERE fingerprint = ?",
                              [(now, fp) for fp in fingerprints])

    def acknowledge(self, fingerprint: str, by: str, now: float) -> StoredAlert | None:
        self.conn.execute("UPDATE alerts SET acked_at = ?, acked_by = ? WHERE fingerprint = ?",
                          (now, by, fingerprint))
        return self.alert(fingerprint)

    def active_silences(self, now: float) -> list[Silence]:
        rows = self.conn.execute("SELECT * FROM silences WHERE ends_at > ?", (now,)).fetchall()
        return [s for s in map(_silence, rows) if s.active(now)]

    def add_action(self, action: Action, fingerprint: str) -> Action:
        """Store an action (its ``id`` assigned here) and note it on its alert."""
        plan = _plan_json(action)
        seq = self.conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM actions WHERE run_id = ?",
                                (action.run_id,)).fetchone()[0]
        self.conn.execute(
            "INSERT INTO actions (run_id, seq, action, rule, type, step, fingerprint, message, "
            "created_at, plan) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (action.run_id, seq, action.action, action.rule, action.type, action.step,
             fingerprint, action.message, action.created_at, plan),
        )
        self.conn.execute("UPDATE alerts SET action = ? WHERE fingerprint = ?",
                          (action.message, fingerprint))
        self.added_actions = True
        return replace(action, id=int(seq))

    def rollbacks(self, run_id: str) -> list[Action]:
        """The run's rollback decisions, oldest first (``plan.number`` 1, 2, ...)."""
        rows = self.conn.execute("SELECT * FROM actions WHERE run_id = ? AND action = "
                                 "'rollback' ORDER BY seq", (run_id,)).fetchall()
        return [_action(r) for r in rows]

    def has_action(self, run_id: str, rule: str, action: str) -> bool:
        """Whether ``rule`` ever took ``action`` for the run."""
        return self.conn.execute(
            "SELECT 1 FROM actions WHERE run_id = ? AND rule = ? AND action = ? LIMIT 1",
            (run_id, rule, action)).fetchone() is not None

    def rewind(self, run_id: str, step: int) -> None:
        """The run's history after ``step`` was replaced by a new attempt: its open alerts
        last saw at most ``step``, and began at most there (what the new attempt finds
        after ``step`` comes after them)."""
        self.conn.execute("UPDATE alerts SET last_step = ?, first_step = MIN(first_step, ?) "
                          "WHERE run_id = ? AND state != 'resolved' AND last_step > ?",
                          (step, step, run_id, step))

    def note_action(self, fingerprint: str, message: str) -> None:
        """An alert whose finding an action already taken for its run answers (a rollback
        decided on another rank's alert): its pages say what was done."""
        self.conn.execute("UPDATE alerts SET action = ? WHERE fingerprint = ?",
                          (message, fingerprint))

    def set_checkpoint(self, fingerprint: str, line: str | None) -> None:
        """The run's last clean checkpoint as the alert's next page names it."""
        self.conn.execute("UPDATE alerts SET checkpoint = ? WHERE fingerprint = ?",
                          (line, fingerprint))

    def pending_rollbacks(self, run_id: str) -> list[tuple[Action, str]]:
        """Rollbacks of a run not yet applied, with the fingerprint of each one's alert."""
        rows = self.conn.execute(
            "SELECT * FROM actions WHERE run_id = ? AND action = 'rollback' AND "
            "honoured_step IS NULL AND withdrawn_by IS NULL", (run_id,)).fetchall()
        return [(_action(r), r["fingerprint"]) for r in rows]

    def healing(self, run_id: str) -> list[tuple[Action, str]]:
        """The run's restarts, exclusions and rollbacks not withdrawn, oldest first, with
        each one's alert: the history a restart decision weighs (alerting/restart.py)."""
        rows = self.conn.execute(
            "SELECT * FROM actions WHERE run_id = ? AND action IN ('restart', 'exclude', "
            "'rollback') AND withdrawn_by IS NULL ORDER BY seq", (run_id,)).fetchall()
        return [(_action(r), r["fingerprint"]) for r in rows]

    def pending_restarts(self, run_id: str) -> list[tuple[Action, str]]:
        """Restarts and exclusions of a run not yet carried out (no attempt resumed since),
        with the fingerprint of each one's alert."""
        rows = self.conn.execute(
            "SELECT * FROM actions WHERE run_id = ? AND action IN ('restart', 'exclude') AND "
            "honoured_step IS NULL AND withdrawn_by IS NULL ORDER BY seq",
            (run_id,)).fetchall()
        return [(_action(r), r["fingerprint"]) for r in rows]

    def open_stops(self, run_id: str, through_step: int) -> list[tuple[Action, str]]:
        """Stop requests of a run at or before ``through_step`` not yet honoured, with the
        fingerprint of the alert each belongs to."""
        rows = self.conn.execute(
            "SELECT * FROM actions WHERE run_id = ? AND action = 'stop' AND "
            "honoured_step IS NULL AND step <= ?", (run_id, through_step)).fetchall()
        return [(_action(r), r["fingerprint"]) for r in rows]

    def withdraw(self, old: Action, by: Action, why: str, fingerprint: str) -> None:
        """The pending rollback ``old`` is replaced by ``by`` (its checkpoint turned
        suspect); its alert names the new plan."""
        self.conn.execute("UPDATE actions SET withdrawn_by = ?, message = ? "
                          "WHERE run_id = ? AND seq = ?",
                          (by.id, f"withdrawn: {why}; replaced by action {by.id}",
                           old.run_id, old.id))
        self.conn.execute("UPDATE alerts SET action = ? WHERE fingerprint = ? AND action = ?",
                          (by.message, fingerprint, old.message))

    def honour(self, old: Action, new: Action, fingerprint: str) -> None:
        """The action ``old`` became ``new`` (honoured); its alert says so unless it moved on."""
        self.conn.execute("UPDATE actions SET honoured_step = ?, message = ? "
                          "WHERE run_id = ? AND seq = ?",
                          (new.honoured_step, new.message, old.run_id, old.id))
        self.conn.execute("UPDATE alerts SET action = ? WHERE fingerprint = ? AND action = ?",
                          (new.message, fingerprint, old.message))
