"""What a node sidecar owes its run's leader: digests and findings, kept until acknowledged.

A node sidecar (monitor_agent/cluster) forwards, for each multi-node run it follows, a
compact digest of every record its own ranks sent and each finding its detectors made.
They wait here, in the record store's database, until the leader answers that it stored
them: a leader that is away (killed, restarting, cut off) loses nothing, and the node
sidecar catches it up when it is back. The engine queues (in the transaction that stores
the findings of a batch); the link thread (cluster/link.py) reads, acknowledges and, when
the leader has been away too long, marks what it paged here itself.

Flags say what the leader is to do with a finding: ``PAGED``, paged by this node sidecar
while the leader was away (the leader records it without paging it again); ``LOCAL_VIEW``,
a cross-rank finding made from this node's ranks alone (the leader makes its own from the
digests of every node, and uses this one only if it was ``PAGED``). ``DROPPABLE`` marks a
plain step digest, the only kind let go when a long absence fills the queue.

    >>> db = Database(":memory:", MIGRATIONS)
    >>> queue = UplinkQueue(db)
    >>> queue.put([UplinkRow("http://node-0:9400", "gpt-7", "record", b"{}", DROPPABLE),
    ...            UplinkRow("http://node-0:9400", "gpt-7", "finding", b"{}", LOCAL_VIEW)],
    ...           now=10.0)
    >>> [(q.kind, q.flags) for q in queue.batch("http://node-0:9400", limit=10)]
    [('record', 4), ('finding', 2)]
    >>> [q.id for q in queue.stranded("http://node-0:9400")]
    [2]
    >>> queue.ack([1, 2]); queue.depth("http://node-0:9400")
    0
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from monitor_agent.storage.database import Database, storage_errors

PAGED = 1
LOCAL_VIEW = 2
DROPPABLE = 4
CLOSED = 8  # paged here and its resolve told here too (the run ended while the leader was away)

MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE uplink (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        leader    TEXT NOT NULL,
        run_id    TEXT NOT NULL,
        kind      TEXT NOT NULL,      -- record | finding
        body      BLOB NOT NULL,      -- a digest (cluster/digest.py) or a finding, JSON
        flags     INTEGER NOT NULL DEFAULT 0,
        queued_at REAL NOT NULL
    );
    CREATE INDEX uplink_leader ON uplink (leader, id);
    """,
)
"""Appended to the record store's migrations (storage/store.py)."""


@dataclass(frozen=True, slots=True)
class UplinkRow:
    """One item to forward: a record's digest or a finding, for ``leader``."""

    leader: str
    run_id: str
    kind: str
    body: bytes
    flags: int = 0


@dataclass(frozen=True, slots=True)
class UplinkItem:
    """An ``UplinkRow`` as queued: its id (the order it goes in) and when it was queued."""

    id: int
    run_id: str
    kind: str
    body: bytes
    flags: int
    queued_at: float


class UplinkQueue:
    """The uplink table; the record store's thread only (the engine's)."""

    def __init__(self, db: Database) -> None:
        self._db = db

    @storage_errors("cannot queue for the run's leader")
    def put(self, rows: Sequence[UplinkRow], now: float) -> None:
        if not rows:
            return
        with self._db.tx() as conn:
            conn.executemany(
                "INSERT INTO uplink (leader, run_id, kind, body, flags, queued_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(r.leader, r.run_id, r.kind, r.body, r.flags, now) for r in rows])

    def batch(self, leader: str, limit: int) -> list[UplinkItem]:
        """The oldest ``limit`` items owed to ``leader``, oldest first."""
        rows = self._db.query(
            "SELECT id, run_id, kind, body, flags, queued_at FROM uplink WHERE leader = ? "
            "ORDER BY id LIMIT ?", (leader, limit))
        return [UplinkItem(*row) for row in rows]

    @storage_errors("cannot acknowledge the leader's answer")
    def ack(self, ids: Sequence[int]) -> None:
        """The leader stored these (or refused them for good): they are done."""
        with self._db.tx() as conn:
            conn.executemany("DELETE FROM uplink WHERE id = ?", [(i,) for i in ids])

    def stranded(self, leader: str) -> list[UplinkItem]:
        """Findings owed to ``leader`` that nobody has paged about: when the leader is
        away, the node sidecar pages them itself."""
        rows = self._db.query(
            "SELECT id, run_id, kind, body, flags, queued_at FROM uplink WHERE leader = ? "
            "AND kind = 'finding' AND flags & ? = 0 ORDER BY id", (leader, PAGED))
        return [UplinkItem(*row) for row in rows]

    @storage_errors("cannot mark findings paged")
    def mark_paged(self, ids: Sequence[int]) -> None:
        with self._db.tx() as conn:
            conn.executemany("UPDATE uplink SET flags = flags | ? WHERE id = ?",
                             [(PAGED, i) for i in ids])

    @storage_errors("cannot mark findings closed")
    def mark_closed(self, leader: str, run_id: str) -> None:
        """The run ended here while ``leader`` was away, and what was paged here about it
        was resolved here, saying so: the leader is to send no second resolve."""
        with self._db.tx() as conn:
            conn.execute("UPDATE uplink SET flags = flags | ? WHERE leader = ? AND run_id = ? "
                         "AND kind = 'finding' AND flags & ? != 0", (CLOSED, leader, run_id,
                                                                      PAGED))

    def depth(self, leader: str) -> int:
        return int(self._db.query("SELECT COUNT(*) FROM uplink WHERE leader = ?",
                                  (leader,))[0][0])

    def oldest(self, leader: str) -> float | None:
        """When the oldest item still owed to ``leader`` was queued."""
        rows = self._db.query("SELECT queued_at FROM uplink WHERE leader = ? ORDER BY id "
                              "LIMIT 1", (leader,))
        return float(rows[0][0]) if rows else None

    def leaders(self) -> list[str]:
        return [str(r[0]) for r in self._db.query("SELECT DISTINCT leader FROM uplink")]

    @storage_errors("cannot trim the uplink queue")
    def trim(self, leader: str, max_rows: int) -> int:
        """Let the oldest step digests go past ``max_rows``; return how many went."""
        excess = self.depth(leader) - max_rows
        if excess <= 0:
            return 0
        with self._db.tx() as conn:
            cur = conn.execute(
                "DELETE FROM uplink WHERE id IN (SELECT id FROM uplink WHERE leader = ? AND "
                "flags & ? != 0 ORDER BY id LIMIT ?)", (leader, DROPPABLE, excess))
        return int(cur.rowcount)
