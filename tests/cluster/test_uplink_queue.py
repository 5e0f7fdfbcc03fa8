"""What a node sidecar owes its leader survives a restart and goes in order."""

from __future__ import annotations

from pathlib import Path

from monitor_agent.storage.store import Store
from monitor_agent.storage.uplink import DROPPABLE, LOCAL_VIEW, PAGED, VITAL, UplinkRow

LEADER = "http://gpu-node-0:9400"


def test_items_wait_in_order_across_a_reopen_until_acknowledged(tmp_path: Path):
    store = Store(tmp_path / "m.sqlite")
    store.uplink.put([UplinkRow(LEADER, "r", "record", b'{"n": %d}' % i, DROPPABLE)
                      for i in range(5)], now=1.0)
    store.uplink.put([UplinkRow("http://other:9400", "q", "finding", b"{}", 0)], now=2.0)
    store.close()
    again = Store(tmp_path / "m.sqlite")
    first = again.uplink.batch(LEADER, limit=3)
    assert [q.body for q in first] == [b'{"n": 0}', b'{"n": 1}', b'{"n": 2}']
    again.uplink.ack([q.id for q in first])
    assert [q.body for q in again.uplink.batch(LEADER, 10)] == [b'{"n": 3}', b'{"n": 4}']
    assert sorted(again.uplink.leaders()) == [LEADER, "http://other:9400"]
    assert again.uplink.oldest(LEADER) == 1.0


def test_stranded_findings_are_paged_once():
    store = Store(":memory:")
    rows = [UplinkRow(LEADER, "r", "record", b"step", DROPPABLE) for _ in range(6)]
    rows += [UplinkRow(LEADER, "r", "finding", b"f1", 0),
             UplinkRow(LEADER, "q", "finding", b"f2", LOCAL_VIEW),
             UplinkRow(LEADER, "r", "record", b"checkpoint", VITAL)]
    store.uplink.put(rows, now=1.0)
    assert [q.body for q in store.uplink.stranded(LEADER, "q")] == [b"f2"]
    stranded = store.uplink.stranded(LEADER)
    assert [q.body for q in stranded] == [b"f1", b"f2"]
    store.uplink.mark_paged([q.id for q in stranded])
    assert store.uplink.stranded(LEADER) == []
    assert all(q.flags & PAGED for q in store.uplink.batch(LEADER, 100) if q.kind == "finding")


def test_one_bound_for_every_leader_drops_in_the_stated_order():
    """Rows of every leader count against one bound; past it items go step digests first,
    then other digests, findings paged here, vital digests, and last findings nobody paged
    (handed back to be paged before they go), oldest first within each."""
    store = Store(":memory:")
    queue = store.uplink
    leaders = [f"http://10.0.0.{i}:9400" for i in range(4)]
    for i, leader in enumerate(leaders):  # each leader's share is small; together over
        queue.put([UplinkRow(leader, "r", "record", b"step%d" % i, DROPPABLE),
                   UplinkRow(leader, "r", "record", b"eval%d" % i, 0),
                   UplinkRow(leader, "r", "finding", b"told%d" % i, PAGED),
                   UplinkRow(leader, "r", "record", b"run%d" % i, VITAL),
                   UplinkRow(leader, "r", "finding", b"new%d" % i, 0)], now=float(i))
    assert (queue.rows, queue.bytes) == (20, sum(len(b) for b in (
        b"step0", b"eval0", b"told0", b"run0", b"new0")) * 4)
    assert queue.trim(max_rows=20, max_bytes=10**6) == (0, [])
    dropped, unheard = queue.trim(max_rows=10, max_bytes=10**6)  # to 9 rows
    assert (dropped, unheard) == (11, [])
    left = sorted(q.body for x in leaders for q in queue.batch(x, 100))
    assert left == sorted([b"told3", *(b"run%d" % i for i in range(4)),
                           *(b"new%d" % i for i in range(4))])
    assert queue.trim(max_rows=5, max_bytes=10**6) == (5, [])  # to 4: the paged, then vital
    assert sorted(q.body for x in leaders for q in queue.batch(x, 100)) == \
        [b"new%d" % i for i in range(4)]
    dropped, unheard = queue.trim(max_rows=3, max_bytes=10**6)  # to 2: findings nobody paged
    assert dropped == 2 and [q.body for q in unheard] == [b"new0", b"new1"]
    assert queue.rows == 2
    # The bytes bound too: a fat finding over it goes (after the vital digest, in the
    # order), handed back to be paged; a small one stays.
    store2 = Store(":memory:")
    store2.uplink.put([UplinkRow(LEADER, "r", "finding", b"x" * 5000, 0),
                       UplinkRow(LEADER, "r", "record", b"run", VITAL),
                       UplinkRow(LEADER, "r", "finding", b"small", 0)], now=1.0)
    dropped, unheard = store2.uplink.trim(max_rows=1000, max_bytes=4000)
    assert dropped == 2 and [len(q.body) for q in unheard] == [5000]
    assert [q.body for q in store2.uplink.batch(LEADER, 10)] == [b"small"]
