"""The leader's view of a run's nodes: whose it has, whose it lacks, and for how long."""

from __future__ import annotations

from monitor_agent.cluster.roster import START_GRACE_SECONDS, Roster, span


def test_a_single_node_run_is_never_partial():
    assert Roster().partial(now=1e6, timeout=3.0, started=0.0) is None


def test_a_node_never_heard_from_is_missed_only_after_the_start_grace():
    roster = Roster()
    roster.expect(nodes=3, local_world_size=4)
    early = 100.0 + START_GRACE_SECONDS - 1
    roster.heard(1, "s1", "gpu-1", [4, 5, 6, 7], now=early)
    assert roster.partial(now=early, timeout=3.0, started=100.0) is None
    late = roster.partial(now=early + 4, timeout=3.0, started=100.0)
    assert late == ("node 1 (gpu-1, ranks 4-7) not heard from for 4 s; "
                    "node 2 (ranks 8-11) never heard from")
    assert roster.unreachable(now=200.0, timeout=3.0, started=100.0) == set(range(4, 12))


def test_a_node_heard_again_is_back_in_view():
    roster = Roster()
    roster.expect(nodes=2)
    roster.heard(1, "s1", None, [1], now=10.0)
    assert roster.partial(now=20.0, timeout=3.0, started=0.0) is not None
    roster.heard(1, "s1", None, [1], now=20.0)
    assert roster.partial(now=21.0, timeout=3.0, started=0.0) is None


def test_ranks_read_as_people_read_them():
    assert span([0, 2, 5, 6, 7]) == "0, 2, 5-7"
    assert span([]) == ""
