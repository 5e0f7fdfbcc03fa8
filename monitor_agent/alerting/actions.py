"""Actions back to the trainer: a rule may ask the run to ``stop`` or to ``checkpoint``.

An action is taken once per alert episode, when the episode's ``action_after``-th matching
finding arrives (``action_after: 3`` on ``nan_inf`` = "stop on repeated NaN"). It is
stored in the alert database in the same transaction as the alert state, remembered on
the alert so every page of that alert says what was done, returned to the client in the
ingest response, and served by ``GET /v1/runs/{run_id}/actions`` for ranks and pollers
that did not post the record.

A stop is only a request until the trainer honours it, some steps later (the client sees
it on its next answer or poll). So the page first says "stop requested at step N by rule
R"; when the run's end record arrives with status ``stopped``, its step is the step the
trainer stopped at (``honoured``), and the alert then says "run stopped at step M by rule
R (stop requested at step N)".

Example::

    with db.tx() as conn:
        action = take(conn, rule, finding, fingerprint="ab12", now=time.time())
    for a in actions_for_run(db, "gpt-7", after=0):
        print(a.id, a.action, a.message)
"""

from __future__ import annotations

import sqlite3
from dataclasses import asdict, dataclass, replace
from typing import Any

from monitor_agent.alerting.rules import Rule
from monitor_agent.database import Database
from monitor_agent.types import Finding

ACTIONS: tuple[str, ...] = ("stop", "checkpoint")
"""Actions the trainer is asked to take; ``notify-only`` (the default) takes none."""


@dataclass(frozen=True, slots=True)
class Action:
    """One action a rule took for a run; ``id`` orders a run's actions (poll with after=id)."""

    id: int
    run_id: str
    action: str
    rule: str
    type: str
    step: int          # the step of the finding that triggered it (the request)
    message: str
    created_at: float
    honoured_step: int | None = None  # stop: the step the trainer stopped at, once known

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_row(cls, row: sqlite3.Row) -> Action:
        return cls(id=row["id"], run_id=row["run_id"], action=row["action"], rule=row["rule"],
                   type=row["type"], step=row["step"], message=row["message"],
                   created_at=row["created_at"], honoured_step=row["honoured_step"])


def describe(action: str, step: int, rule: str, honoured_step: int | None = None) -> str:
    """The sentence pages carry, so whoever is paged knows what the run did about it."""
    if action == "stop" and honoured_step is not None:
        return f"run stopped at step {honoured_step} by rule {rule} (stop requested at step {step})"
    return f"{action} requested at step {step} by rule {rule}"


def due(rule: Rule, count: int) -> bool:
    """Whether the ``count``-th finding of an episode triggers the rule's action."""
    return rule.action in ACTIONS and count == rule.action_after


def take(conn: sqlite3.Connection, rule: Rule, finding: Finding, fingerprint: str,
         now: float) -> Action:
    """Record the action inside the caller's transaction and note it on the alert."""
    message = describe(rule.action, finding.step, rule.name)
    cur = conn.execute(
        "INSERT INTO actions (run_id, action, rule, type, step, fingerprint, message, "
        "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        (finding.run_id, rule.action, rule.name, finding.type, finding.step, fingerprint,
         message, now),
    )
    conn.execute("UPDATE alerts SET action = ? WHERE fingerprint = ?", (message, fingerprint))
    return Action(id=int(cur.lastrowid or 0), run_id=finding.run_id, action=rule.action,
                  rule=rule.name, type=finding.type, step=finding.step, message=message,
                  created_at=now)


def honour_stops(conn: sqlite3.Connection, run_id: str, step: int) -> list[Action]:
    """The run ended ``stopped`` at ``step``: settle its open stop requests, reword alerts."""
    rows = conn.execute("SELECT * FROM actions WHERE run_id = ? AND action = 'stop' AND "
                        "honoured_step IS NULL AND step <= ?", (run_id, step)).fetchall()
    done = []
    for row in rows:
        message = describe("stop", row["step"], row["rule"], step)
        conn.execute("UPDATE actions SET honoured_step = ?, message = ? WHERE id = ?",
                     (step, message, row["id"]))
        conn.execute("UPDATE alerts SET action = ? WHERE fingerprint = ? AND action = ?",
                     (message, row["fingerprint"], row["message"]))
        done.append(replace(Action.from_row(row), message=message, honoured_step=step))
    return done


def actions_for_run(db: Database, run_id: str, after: int = 0, limit: int = 100) -> list[Action]:
    """A run's actions with ``id > after``, oldest first."""
    rows = db.query("SELECT * FROM actions WHERE run_id = ? AND id > ? ORDER BY id LIMIT ?",
                    (run_id, after, limit))
    return [Action.from_row(r) for r in rows]


def stop_requested(db: Database, run_id: str) -> bool:
    """Whether any rule ever asked this run to stop."""
    rows = db.query("SELECT 1 FROM actions WHERE run_id = ? AND action = 'stop' LIMIT 1",
                    (run_id,))
    return bool(rows)


def action_counts(db: Database) -> dict[tuple[str, str, str], int]:
    """(run_id, action, rule) -> how many times it was taken, for the exposition."""
    rows = db.query("SELECT run_id, action, rule, COUNT(*) AS n FROM actions "
                    "GROUP BY run_id, action, rule")
    return {(r["run_id"], r["action"], r["rule"]): r["n"] for r in rows}
