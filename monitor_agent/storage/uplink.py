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
plain step digest, ``VITAL`` a run, checkpoint or end record's digest (what places the run,
what a rollback goes back to, how it ended).

The queue has one bound for every leader together (``trim``: ``cluster.uplink_max_rows``
and ``uplink_max_bytes``): a run record can name any number of leaders, and each dead one
would hold its own share. Past either bound, items go in this order, oldest first within
each class: step digests; the other digests (evaluations, hangs, agreements) but the vital
ones; findings already paged here; vital digests; last, findings nobody paged, which the
engine pages here before they go (``BatchEnd.queue_and_count``). Each trim takes the queue to 90% of
its bounds, so it runs once per tenth of them, not on every put.

    >>> db = Database(":memory:", MIGRATIONS)
    >>> queue = UplinkQueue(db)
    >>> queue.put([UplinkRow("http://node-0:9400", "gpt-7", "record", b"{}", DROPPABLE),
    ...            UplinkRow("http://node-0:9400", "gpt-7", "finding", b"{}", LOCAL_VIEW)],
    ...           now=10.0)
    >>> [(q.kind, q.flags) for q in queue.batch("http://node-0:9400", limit=10)]
    [('record', 4), ('finding', 2)]
    >>> [q.id for q in queue.stranded("http://node-0:9400")]
    [2]
    >>> queue.ack([1, 2]); queue.depth("http://node-0:9400"), queue.rows
    (0, 0)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

from monitor_agent.storage.database import Database, storage_errors

PAGED = 1
LOCAL_VIEW = 2
DROPPABLE = 4
CLOSED = 8  # paged here and its resolve told here too (the run ended while the leader was away)
VITAL = 16  # a run, checkpoint or end record's digest: the last digests to go
TRIM_TO = 0.9  # a trim leaves this share of each bound

DROP_ORDER = (
    f"flags & {DROPPABLE} != 0",
    f"kind = 'record' AND flags & {DROPPABLE} = 0 AND flags & {VITAL} = 0",
    f"kind = 'finding' AND flags & {PAGED} != 0",
    f"kind = 'record' AND flags & {VITAL} != 0",
    f"kind = 'finding' AND flags & {PAGED} = 0",
)
"""The classes of queued items in the order a trim lets them go (module docstring); each
is read in id order (the table's own), so a trim scans only as far as it drops."""

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


class UplinkItem(NamedTuple):
    """An ``UplinkRow`` as queued: its id (the order it goes in) and when it was queued."""

    id: int
    run_id: str
    kind: str
    body: bytes
    flags: int
    queued_at: float


class UplinkQueue:
    """The uplink table; the record store's thread only (the engine's). It keeps its own
    count of rows and bytes (one scan when first asked), so the global bound costs
    nothing per put."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self._size: tuple[int, int] | None = None  # (rows, bytes), once counted

    @property
    def rows(self) -> int:
        return self._counted()[0]

    @property
    def bytes(self) -> int:
        return self._counted()[1]

    def _counted(self) -> tuple[int, int]:
        if self._size is None:
            rows, size = self._db.query("SELECT COUNT(*), COALESCE(SUM(length(body)), 0) "
                                        "FROM uplink")[0]
            self._size = (int(rows), int(size))
        return self._size

    def _count(self, rows: int, size: int) -> None:
        if self._size is not None:
            self._size = (self._size[0] + rows, self._size[1] + size)

    @storage_errors("cannot queue for the run's leader")
    def put(self, rows: Sequence[UplinkRow], now: float) -> None:
        if not rows:
            return
        self._counted()
        with self._db.tx() as conn:
            conn.executemany(
                "INSERT INTO uplink (leader, run_id, kind, body, flags, queued_at) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                [(r.leader, r.run_id, r.kind, r.body, r.flags, now) for r in rows])
        self._count(len(rows), sum(len(r.body) for r in rows))

    def batch(self, leader: str, limit: int, skip: Sequence[str] = ()) -> list[UplinkItem]:
        """The oldest ``limit`` items owed to ``leader``, oldest first; none of the runs in
        ``skip`` (the leader said it does not take them now: cluster/link.py)."""
        skip = list(skip)[:500]
        others = f" AND run_id NOT IN ({','.join('?' * len(skip))})" if skip else ""
        rows = self._db.query(
            "SELECT id, run_id, kind, body, flags, queued_at FROM uplink WHERE leader = ?"
            f"{others} ORDER BY id LIMIT ?", (leader, *skip, limit))
        return [UplinkItem(*row) for row in rows]

    @storage_errors("cannot acknowledge the leader's answer")
    def ack(self, ids: Sequence[int]) -> None:
        """The leader stored these (or refused them for good): they are done."""
        self._delete(ids)

    def _delete(self, ids: Sequence[int]) -> None:
        if not ids:
            return
        self._counted()
        rows = size = 0
        with self._db.tx() as conn:
            for chunk in range(0, len(ids), 500):
                part = list(ids[chunk:chunk + 500])
                marks = ",".join("?" * len(part))
                found = conn.execute(f"SELECT COUNT(*), COALESCE(SUM(length(body)), 0) FROM "
                                     f"uplink WHERE id IN ({marks})", part).fetchone()
                conn.execute(f"DELETE FROM uplink WHERE id IN ({marks})", part)
                rows, size = rows + int(found[0]), size + int(found[1])
        self._count(-rows, -size)

    def stranded(self, leader: str, run_id: str | None = None) -> list[UplinkItem]:
        """Findings owed to ``leader`` (of ``run_id``, or every run) that nobody has paged
        about: when the leader is away, or will not take the run, the node sidecar pages
        them itself."""
        run = " AND run_id = ?" if run_id is not None else ""
        rows = self._db.query(
            "SELECT id, run_id, kind, body, flags, queued_at FROM uplink WHERE leader = ? "
            f"AND kind = 'finding' AND flags & ? = 0{run} ORDER BY id",
            (leader, PAGED, *((run_id,) if run_id is not None else ())))
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
    def trim(self, max_rows: int, max_bytes: int) -> tuple[int, list[UplinkItem]]:
        """Over either bound (every leader's items together): let items go in the drop
        order (module docstring) until the queue is at ``TRIM_TO`` of both. Returns how
        many went, and the findings among them that nobody paged (the engine pages them
        here: none is lost unheard)."""
        rows, size = self._counted()
        if rows <= max_rows and size <= max_bytes:
            return 0, []
        rows_over = rows - int(max_rows * TRIM_TO)
        bytes_over = size - int(max_bytes * TRIM_TO)
        victims: list[int] = []
        unheard: list[UplinkItem] = []
        for where in DROP_ORDER:
            after = 0
            while rows_over > 0 or bytes_over > 0:
                found = self._db.query(
                    "SELECT id, run_id, kind, body, flags, queued_at FROM uplink WHERE "
                    f"id > ? AND {where} ORDER BY id LIMIT 1000", (after,))
                if not found:
                    break
                for item in map(UplinkItem._make, found):
                    victims.append(item.id)
                    rows_over, bytes_over = rows_over - 1, bytes_over - len(item.body)
                    if item.kind == "finding" and not item.flags & PAGED:
                        unheard.append(item)
                    after = item.id
                    if rows_over <= 0 and bytes_over <= 0:
                        break
        self._delete(victims)
        return len(victims), unheard
