"""The node whose link is slow, judged from the TCP figures of each pair of nodes
(runs/network_slow.py), on plain numbers: the figures below are those measured on a
namespace cluster of four nodes passing data round a ring (``ss -tin``), node a's link
capped with ``tc tbf`` and not."""

from __future__ import annotations

import dataclasses

from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.network_slow import LinkJudge, Rtt, collective, slow_node
from monitor_agent.runs.node_verdict import Mark, NodeVerdicts

# a -> b -> c -> d -> a, each node sending to the next; a capped.
CAPPED = {("a", "b"): Rtt(68.29, 8.168), ("b", "c"): Rtt(0.124, 0.073),
          ("c", "d"): Rtt(0.082, 0.029), ("d", "a"): Rtt(79.61, 1.971)}
# The same ring uncapped, busy: each pair's RTT varies several-fold.
UNCAPPED = {("a", "b"): Rtt(0.216, 0.193), ("b", "c"): Rtt(0.366, 0.427),
            ("c", "d"): Rtt(0.278, 0.289), ("d", "a"): Rtt(0.481, 0.527)}


def test_the_node_common_to_the_slow_pairs_is_named_with_its_evidence():
    found = slow_node(CAPPED)
    assert found is not None and found.node == "a"
    assert found.peers == ("b", "d")
    assert found.slow_ms == (68.29, 79.61) and found.others_ms == (0.082, 0.124)
    assert "68.3 ms-79.6 ms" in found.words() and "0.082 ms-0.124 ms" in found.words()


def test_a_quiet_pair_of_the_capped_node_does_not_hide_it():
    """The capped node hosts the rendezvous store: node c's request/response connection to
    it measured a quiet moment of its queue. Most of its pairs are slow: it is named,
    saying how many."""
    pairs = {**CAPPED, ("c", "a"): Rtt(0.09, 0.04)}
    found = slow_node(pairs)
    assert found is not None and found.node == "a" and (found.slow_pairs, found.pairs) == (2, 3)
    assert "2 of its 3 pairs" in found.words()


def test_a_node_with_fewer_than_half_its_pairs_slow_is_not_named():
    pairs = {**CAPPED, ("c", "a"): Rtt(0.09, 0.04), ("a", "c"): Rtt(0.1, 0.04),
             ("e", "a"): Rtt(0.1, 0.05), ("e", "c"): Rtt(0.1, 0.05)}
    assert slow_node(pairs) is None


def test_a_stores_request_response_pairs_neither_hide_the_node_nor_set_the_bound():
    """One judgement's figures from the namespace cluster, node a (the stores' host and the
    leader) capped, a ring a -> c -> b -> a of one rank a node: the collective's pairs
    moved 550-780 KB since the sample before, the store's 1.3-1.7 KB, one of them between
    the uncapped nodes at 3.8 ms +- 6.3 (its peer's answer time): that one would set the
    bound at 29 ms, past a's quiet 4.1 ms pair; the collective's pairs set it at 0.2 ms."""
    pairs = {("b", "a"): Rtt(34.486, 18.396, 554_976), ("b", "c"): Rtt(3.805, 6.277, 1_344),
             ("c", "a"): Rtt(54.504, 21.593, 1_296), ("c", "b"): Rtt(0.083, 0.033, 554_964),
             ("a", "b"): Rtt(7.16, 10.266, 1_728), ("a", "c"): Rtt(4.134, 6.544, 777_000)}
    assert set(collective(pairs)) == {("b", "a"), ("c", "b"), ("a", "c")}
    found = slow_node(pairs)
    assert found is not None and found.node == "a" and found.bound_ms < 0.25, found


def test_an_uncapped_ring_names_nobody_though_its_pairs_differ_two_fold():
    assert slow_node(UNCAPPED) is None


def test_the_margin_is_the_other_pairs_own_noise_not_a_number_of_milliseconds():
    """Node a's pairs 3x the uncapped ones: named when the other pairs are steady, not
    when they swing as the uncapped ring's measured ones did."""
    steady = {k: Rtt(v.rtt_ms * 3 if "a" in k else v.rtt_ms, 0.01)
              for k, v in UNCAPPED.items()}
    noisy = {k: Rtt(v.rtt_ms, UNCAPPED[k].rttvar_ms) for k, v in steady.items()}
    assert slow_node(steady) is not None and slow_node(steady).node == "a"
    assert slow_node(noisy) is None


def test_one_slow_pair_cannot_tell_its_two_ends_apart():
    pairs = {**UNCAPPED, ("a", "b"): Rtt(70.0, 5.0)}
    assert slow_node(pairs) is None


def test_two_slow_nodes_have_no_one_node_in_common_and_nobody_is_named():
    pairs = {**CAPPED, ("b", "c"): Rtt(60.0, 5.0)}  # b capped too
    assert slow_node(pairs) is None


def test_without_a_pair_to_compare_with_nobody_is_named():
    two_nodes = {("a", "b"): Rtt(70.0, 5.0), ("b", "a"): Rtt(71.0, 5.0)}
    assert slow_node(two_nodes) is None


def test_on_three_nodes_the_capped_one_is_named():
    pairs = {("a", "b"): Rtt(40.0, 3.0), ("b", "c"): Rtt(0.2, 0.1), ("c", "a"): Rtt(45.0, 2.0)}
    assert slow_node(pairs).node == "a"


def _feed(judge: LinkJudge, pairs: dict[tuple[str, str], Rtt], now: float):
    for local in sorted({a for a, _ in pairs}):
        judge.observe(local, {b: r for (a, b), r in pairs.items() if a == local}, now)
    return judge.judge(now)


def test_slow_for_a_window_is_suspect_for_two_sick_and_a_later_episode_sick_at_once():
    judge = LinkJudge(hold_seconds=15.0, max_age_seconds=15.0)
    assert _feed(judge, CAPPED, 100.0) is None  # one moment: not yet
    assert _feed(judge, CAPPED, 110.0) is None
    first = _feed(judge, CAPPED, 115.0)
    assert first is not None and first[0].node == "a" and first[1] is False
    assert _feed(judge, CAPPED, 125.0)[1] is False
    assert _feed(judge, CAPPED, 130.0)[1] is True
    assert _feed(judge, UNCAPPED, 140.0) is None  # recovered: the streak ends
    assert _feed(judge, CAPPED, 200.0) is None
    again = _feed(judge, CAPPED, 215.0)
    assert again is not None and again[1] is True  # a later episode: sick once it holds


def test_a_moment_of_slowness_shorter_than_the_window_names_nobody_ever():
    judge = LinkJudge(hold_seconds=15.0, max_age_seconds=15.0)
    for t in range(0, 300, 20):
        assert _feed(judge, CAPPED, float(t)) is None
        assert _feed(judge, CAPPED, t + 10.0) is None
        assert _feed(judge, UNCAPPED, t + 12.0) is None
    assert judge.episodes == {}


def test_figures_older_than_their_age_limit_are_not_judged():
    judge = LinkJudge(hold_seconds=15.0, max_age_seconds=15.0)
    _feed(judge, CAPPED, 100.0)
    # Only node b reports again, much later: a's and d's figures are stale.
    judge.observe("b", {"c": Rtt(0.1, 0.05)}, 200.0)
    assert judge.judge(200.0) is None


def test_a_nodes_new_sample_replaces_its_earlier_pairs():
    judge = LinkJudge(hold_seconds=15.0, max_age_seconds=15.0)
    _feed(judge, CAPPED, 100.0)
    judge.observe("a", {"c": Rtt(0.1, 0.05)}, 101.0)
    assert ("a", "b") not in judge.pairs and ("a", "c") in judge.pairs


# Measured on the namespace cluster (4 nodes x 2 ranks, a ring 3 -> 2 -> 1 -> 0 -> 3 between
# nodes): per pair, the megabytes its busiest connection moved in 5 s and the milliseconds it
# spent sending them (ss: busy less rwnd_limited), with its smoothed RTT then. Two samples
# healthy, then two with node "2" capped at 151 Mbit/s (tbf, both ways): its pairs' round
# trips look like the others', their time per byte does not.
RING = [("0", "3"), ("1", "0"), ("2", "1"), ("3", "2")]
HEALTHY = [[(53.55, 1112, 2.469), (51.71, 836, 0.147), (51.71, 1096, 5.583),
            (53.03, 976, 0.461)],
           [(53.55, 1016, 0.206), (52.89, 1004, 4.193), (53.16, 1116, 0.265),
            (53.55, 844, 0.376)]]
CAPPED_2 = [[(41.35, 1180, 1.032), (41.55, 1244, 6.165), (40.63, 2632, 3.559),
             (40.89, 2788, 2.888)],
            [(41.42, 1052, 3.497), (41.35, 1140, 1.461), (41.27, 2672, 5.756),
             (41.81, 2652, 3.732)]]


def _ring(sample: list[tuple[float, int, float]]) -> dict[tuple[str, str], Rtt]:
    # The kernel's RTT deviation of such a pair: about half its RTT (its samples swing).
    return {pair: Rtt(rtt, rtt / 2, int(mb * 1e6), float(ms))
            for pair, (mb, ms, rtt) in zip(RING, sample, strict=True)}


def test_a_capped_node_is_named_by_its_time_per_byte_where_its_round_trips_say_nothing():
    judge = LinkJudge(hold_seconds=15.0, max_age_seconds=15.0)
    now = 0.0
    for sample in HEALTHY * 2:
        assert slow_node(_ring(sample)) is None  # the round trips alone: nobody, ever
        assert _feed(judge, _ring(sample), now) is None
        now += 5.0
    for sample in CAPPED_2:
        assert slow_node(_ring(sample)) is None
    got = None
    for sample in CAPPED_2 * 2:
        got = _feed(judge, _ring(sample), now)
        now += 5.0
    assert got is not None and got[0].node == "2" and got[0].peers == ("1", "3")
    words = got[0].words()
    assert words.startswith("its link is slow: every pair of it (2 peers: 1, 3) sent data at "
                            "124 Mbit/s-126 Mbit/s while sending"), words
    assert "the pairs without it at 290 Mbit/s-315 Mbit/s (at least 152 Mbit/s" in words, words


def test_a_healthy_ring_of_measured_samples_names_nobody_though_its_rates_differ():
    """Every healthy sample, in every order, for as long as the window: nobody."""
    judge = LinkJudge(hold_seconds=15.0, max_age_seconds=15.0)
    for i in range(40):
        assert _feed(judge, _ring(HEALTHY[i % 2] if i % 3 else HEALTHY[1 - i % 2]),
                     5.0 * i) is None


def test_the_time_per_byte_bound_is_the_other_pairs_own_noise():
    """Node "2" sending at half the others' rate: named once the others' samples are
    steady, not while they swing by as much (their mean deviation sets the margin)."""
    def ring(rates: dict[tuple[str, str], float]) -> dict[tuple[str, str], Rtt]:
        return {p: Rtt(0.5, 0.25, 40_000_000, 40 * 8e3 / r) for p, r in rates.items()}

    steady = {p: 400.0 for p in RING}
    halved = {**steady, ("2", "1"): 200.0, ("3", "2"): 200.0}
    calm = LinkJudge(hold_seconds=0.0, max_age_seconds=15.0)
    for i in range(12):
        _feed(calm, ring(steady), float(i))
    assert _feed(calm, ring(halved), 12.0)[0].node == "2"
    swinging = LinkJudge(hold_seconds=0.0, max_age_seconds=15.0)
    for i in range(12):  # the other pairs alternate 400 and 160 Mbit/s
        _feed(swinging, ring({p: 400.0 if i % 2 else 160.0 for p in RING}), float(i))
    assert _feed(swinging, ring(halved), 12.0) is None
    # A pair without a time per byte (an older node sidecar, a kernel without busy
    # time) is judged on its round trips alone.
    assert slow_node({p: Rtt(0.5, 0.25, 40_000_000) for p in RING}, calm.spreads) is None


def test_a_straggler_reading_does_not_replace_the_measured_link():
    book = NodeVerdicts()
    hosts = {0: "a", 1: "a", 2: "b", 3: "b", 4: "c", 5: "c"}
    assert book.link("a", True, 40, "its link is slow") == "a"
    slow = Finding(type="straggler", severity=Severity.WARNING, run_id="r", step=50,
                   message="rank 0 computes slowly", rank=0, evidence={"cause": "compute"})
    book.observe(slow, hosts, {})
    verdict = {v.node: v for v in book.verdicts(hosts)}["a"]
    assert (verdict.state, verdict.cause, verdict.why) == ("sick", "network-slow",
                                                           "its link is slow")


def test_once_a_link_is_measured_slow_a_late_all_reduce_elsewhere_names_nobody():
    """On the namespace cluster the straggler read node b late to the all-reduce while
    node a's link was capped: the ring waits for a's link, whoever is late to it."""
    book = NodeVerdicts()
    hosts = {0: "a", 1: "b", 2: "c"}
    late = Finding(type="straggler", severity=Severity.WARNING, run_id="r", step=30,
                   message="rank 1 is late to the all-reduce", rank=1,
                   evidence={"cause": "collective"})
    assert book.observe(late, hosts, {}) == "b"
    assert book.link("a", False, 40, "its link is slow") == "a"
    assert book.observe(dataclasses.replace(late, step=50), hosts, {}) is None
    states = {v.node: (v.state, v.cause) for v in book.verdicts(hosts)}
    assert states == {"a": ("suspect", "network-slow"), "b": ("healthy", None),
                      "c": ("healthy", None)}


def test_a_link_verdict_keeps_the_evidence_that_set_it_and_survives_a_restore():
    book = NodeVerdicts()
    assert book.link("a", False, 10, "first") == "a"
    assert book.link("a", False, 11, "second") is None
    assert book.link("a", True, 12, "held") == "a"
    assert book.link("a", False, 13, "softer") is None
    again = NodeVerdicts()
    again.restore(book.to_dict())
    assert again.linked == {"a"}
    assert again.marks["a"]["network-slow"] == Mark("network-slow", True, 12, "held")
