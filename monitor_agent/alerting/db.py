"""Alerting's own SQLite database: the schema of alerts, silences, actions and the outbox.

Separate from the record store so alert durability never waits on record writes. One
connection guarded by a lock: the engine thread, the API threads and the delivery threads
all use it, each for a few short statements (":memory:" works too, for replay and tests).
The SQL on these tables lives in ``alerting/alert_store.py`` (alerts, silences, actions)
and ``notify/outbox.py`` (the outbox); this module only creates and migrates them.

The app opens ``data_dir / "alerts.sqlite"`` and hands the one ``Database`` to both
``AlertStore(db)`` and ``Outbox(db, ...)``; a fresh one has every table, migrated to the
latest version::

    >>> db = open_alert_db(":memory:")
    >>> tables = db.query("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
    >>> [row["name"] for row in tables]
    ['actions', 'alerts', 'outbox', 'outbox_folded', 'silences', 'sqlite_sequence']
    >>> db.query("PRAGMA user_version")[0][0] == len(_MIGRATIONS)
    True
"""

from __future__ import annotations

from pathlib import Path

from monitor_agent.storage.database import Database, Row

_MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE alerts (
        fingerprint     TEXT PRIMARY KEY,
        run_id          TEXT NOT NULL,
        rule            TEXT NOT NULL,
        type            TEXT NOT NULL,
        severity        TEXT NOT NULL,
        layer           TEXT,
        rank            INTEGER,
        identity        TEXT NOT NULL,      -- JSON: fingerprint labels (layer, rank)
        project         TEXT,
        labels          TEXT NOT NULL,      -- JSON: the run's labels
        channels        TEXT NOT NULL,      -- JSON list, fixed when the episode began
        cooldown        REAL NOT NULL,
        repeat_interval REAL NOT NULL,
        resolve_after   REAL NOT NULL,
        state           TEXT NOT NULL,      -- pending | firing | resolved
        started_at      REAL NOT NULL,
        pending_since   REAL,
        last_seen       REAL NOT NULL,      -- time of the latest matching finding
        last_step       INTEGER,
        count           INTEGER NOT NULL,   -- findings in this episode
        notified        TEXT,               -- what people were last told: firing | resolved
        notified_at     REAL,               -- when the last firing/repeat message went out
        refreshed_at    REAL,               -- last re-send to channels that need it
        resolved_at     REAL,
        acked_at        REAL,
        acked_by        TEXT,
        dashboard_url   TEXT,
        finding         BLOB NOT NULL       -- the latest finding, JSON
    );
    CREATE INDEX alerts_state ON alerts (state);
    CREATE INDEX alerts_run ON alerts (run_id);
    CREATE TABLE silences (
        id         TEXT PRIMARY KEY,
        run_id     TEXT,
        type       TEXT,
        alertname  TEXT,
        layer      TEXT,
        comment    TEXT NOT NULL,
        created_by TEXT NOT NULL,
        created_at REAL NOT NULL,
        ends_at    REAL NOT NULL
    );
    CREATE TABLE outbox (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        channel    TEXT NOT NULL,
        body       BLOB NOT NULL,
        created_at REAL NOT NULL,
        attempts   INTEGER NOT NULL DEFAULT 0,
        next_at    REAL NOT NULL,
        state      TEXT NOT NULL DEFAULT 'pending',   -- pending | sent | failed
        last_error TEXT,
        done_at    REAL
    );
    CREATE INDEX outbox_pending ON outbox (channel, state, id);
    """,
    # Actions back to the trainer (alerting/rule_actions.py); an alert remembers the one it took.
    """
    CREATE TABLE actions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      TEXT NOT NULL,
        action      TEXT NOT NULL,      -- stop | checkpoint
        rule        TEXT NOT NULL,
        type        TEXT NOT NULL,      -- the finding type that triggered it
        step        INTEGER NOT NULL,
        fingerprint TEXT NOT NULL,      -- the alert it belongs to
        message     TEXT NOT NULL,
        created_at  REAL NOT NULL
    );
    CREATE INDEX actions_run ON actions (run_id, id);
    ALTER TABLE alerts ADD COLUMN action TEXT;
    """,
    # The step the trainer actually stopped at (its end record), which may be well after
    # the step the stop was requested at.
    """
    ALTER TABLE actions ADD COLUMN honoured_step INTEGER;
    """,
    # Which alerts a notification carries, so GET /v1/alerts can say how delivery went.
    """
    ALTER TABLE outbox ADD COLUMN fingerprints TEXT;
    """,
    # Findings grouped under a page (alerting/related.py), JSON.
    """
    ALTER TABLE alerts ADD COLUMN related TEXT;
    """,
    # A rollback's plan (alerting/rollback.py), JSON, decided once and kept with its
    # action; and the run's last clean checkpoint as the alert's pages name it.
    """
    ALTER TABLE actions ADD COLUMN plan TEXT;
    ALTER TABLE alerts ADD COLUMN checkpoint TEXT;
    """,
    # One run, one brain (monitor_agent/cluster): an action's id is its number within its
    # run (``seq``), so the leader's plan 2 is plan 2 on every node sidecar that serves it;
    # ``origin`` is the leader that decided it (NULL: this sidecar).
    """
    ALTER TABLE actions ADD COLUMN seq INTEGER;
    UPDATE actions SET seq = (SELECT COUNT(*) FROM actions a
                              WHERE a.run_id = actions.run_id AND a.id <= actions.id);
    CREATE UNIQUE INDEX actions_seq ON actions (run_id, seq);
    ALTER TABLE actions ADD COLUMN origin TEXT;
    """,
    # An episode a node sidecar paged and closed (its run ended) while the run's leader was
    # away: the leader keeps it, to fold its own findings of the same fault into, and sends
    # no second resolve.
    """
    ALTER TABLE alerts ADD COLUMN resolved_elsewhere INTEGER NOT NULL DEFAULT 0;
    """,
    # A pending rollback whose checkpoint turned suspect is withdrawn for a new plan
    # (alerting/rollback.py ``revise``): the id of the one that replaced it.
    """
    ALTER TABLE actions ADD COLUMN withdrawn_by INTEGER;
    """,
    # What a flood of made-up runs cannot do (notify/fairness.py): each message's severity
    # class, its run and, for a new run's, where the run came from; a summary of new runs'
    # pages (1 still taking more, 2 sealed at its first attempt) and the alerts folded into
    # it. An alert remembers whether its run was new when its episode began (``newcomer``:
    # that run's source).
    """
    ALTER TABLE outbox ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE outbox ADD COLUMN run_id TEXT;
    ALTER TABLE outbox ADD COLUMN source TEXT;
    ALTER TABLE outbox ADD COLUMN summary INTEGER NOT NULL DEFAULT 0;
    CREATE INDEX outbox_open_summary ON outbox (channel, source) WHERE summary = 1;
    CREATE TABLE outbox_folded (
        channel     TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        summary_id  INTEGER NOT NULL,
        run_id      TEXT NOT NULL,
        alertname   TEXT NOT NULL,
        severity    TEXT NOT NULL,
        PRIMARY KEY (channel, fingerprint)
    );
    CREATE INDEX outbox_folded_summary ON outbox_folded (summary_id);
    ALTER TABLE alerts ADD COLUMN newcomer TEXT;
    """,
    # The step an episode began at (alerting/related.py: only findings at or after it can
    # follow from it). NULL for episodes stored before: they group as they did.
    """
    ALTER TABLE alerts ADD COLUMN first_step INTEGER;
    """,
)


def open_alert_db(path: Path | str) -> Database:
    """The alert database, migrated; locked, since engine, API and senders share it.

    Its failures are ``StorageError``s whose ``source`` is "alert storage" (what readiness
    says when a page could not be made durable)."""
    return Database(path, _MIGRATIONS, threadsafe=True, row_factory=Row,
                    source="alert storage")
