"""What a node sidecar owes its leader survives a restart and goes in order."""

from __future__ import annotations

from pathlib import Path

from monitor_agent.storage.store import Store
from monitor_agent.storage.uplink import DROPPABLE, LOCAL_VIEW, PAGED, UplinkRow

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


def test_stranded_findings_are_paged_once_and_a_long_absence_drops_step_digests_only():
    store = Store(":memory:")
    rows = [UplinkRow(LEADER, "r", "record", b"step", DROPPABLE) for _ in range(6)]
    rows += [UplinkRow(LEADER, "r", "finding", b"f1", 0),
             UplinkRow(LEADER, "r", "finding", b"f2", LOCAL_VIEW),
             UplinkRow(LEADER, "r", "record", b"checkpoint", 0)]
    store.uplink.put(rows, now=1.0)
    stranded = store.uplink.stranded(LEADER)
    assert [q.body for q in stranded] == [b"f1", b"f2"]
    store.uplink.mark_paged([q.id for q in stranded])
    assert store.uplink.stranded(LEADER) == []
    assert all(q.flags & PAGED for q in store.uplink.batch(LEADER, 100) if q.kind == "finding")
    assert store.uplink.trim(LEADER, max_rows=5) == 4
    left = [q.body for q in store.uplink.batch(LEADER, 100)]
    assert left == [b"step", b"step", b"f1", b"f2", b"checkpoint"]
