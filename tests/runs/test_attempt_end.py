"""How an ended attempt's ranks ended, and which died without a word (runs/attempt_end.py),
on the end records the fault suite's SIGKILL trial left on its leader (bench/fault_suite.py,
fs-gone-0: 4 nodes x 2 ranks, local rank 0 of node 2, rank 4, killed; torchrun stopped the
others). Only ranks 3, 5 and 6 sent an end record, each with gloo's lost peer at node 2's
address; ranks 0, 1, 2, 4 and 7 sent none."""

from __future__ import annotations

from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.attempt_end import judge
from monitor_agent.runs.node_verdict import NodeVerdicts

GLOO = "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:{}] {}"
ENDS = {
    3: ("failed", GLOO.format(553, "Connection closed by peer [10.213.229.3]:21170. This is "
                                   "typically caused by a remote worker crashing.")),
    5: ("failed", GLOO.format(537, "Read error [10.213.229.3]:20693: Connection reset by peer. "
                                   "This is typically caused by a remote worker hanging")),
    6: ("failed", GLOO.format(553, "Connection closed by peer [10.213.229.3]:23456.")),
}
HOSTS = {r: f"node{r // 2}" for r in range(8)}
ADDRESSES = {r: f"10.213.229.{r // 2 + 1}" for r in range(8)}


def test_the_killed_rank_is_the_silent_one_on_the_node_its_peers_lost():
    end = judge(1, range(8), ENDS, HOSTS, ADDRESSES)
    assert end.gone == (4,) and end.silent == (0, 1, 2, 4, 7)
    assert end.lost == (3, 5, 6) and end.crashed == ()
    assert end.words() == ("rank 4 on node2 ended without a word (killed, out of memory, or "
                           "lost with its node); ranks 3,5-6 lost it as a peer")


def test_silent_ranks_on_several_nodes_and_no_address_name_nobody():
    end = judge(1, range(8), ENDS, HOSTS)
    assert end.gone == ()
    assert "the dead one among them" in end.words()
    elsewhere = {r: "10.9.9.9" for r in range(8)}  # no node at the address the errors name
    assert judge(1, range(8), ENDS, HOSTS, elsewhere).gone == ()
    one_host = {r: "127.0.0.1" for r in range(8)}  # every node on one loopback host
    assert judge(1, range(8), ENDS, HOSTS, one_host).gone == ()
    # Node 2's address unknown, node 1's the one named: its cut-off rank 2 is not the dead.
    partial = {r: a if r // 2 != 2 else None for r, a in ADDRESSES.items()}
    partial = {r: a.replace("229.2", "229.3") for r, a in partial.items() if a}
    assert judge(1, range(8), ENDS, HOSTS, partial).gone == ()


def test_no_peer_lost_no_gone_a_genuine_exception_explains_the_end():
    assert judge(1, range(8), {}, HOSTS, ADDRESSES).gone == ()  # the whole job stopped
    crash = {**ENDS, 2: ("failed", "torch.OutOfMemoryError: CUDA out of memory.")}
    end = judge(1, range(8), crash, HOSTS, ADDRESSES)
    assert end.gone == () and end.crashed == (2,)
    stopped = {r: ("failed", "KeyboardInterrupt: ") for r in range(8) if r != 4}
    assert judge(1, range(8), stopped, HOSTS, ADDRESSES).gone == ()


STOPPED = ("stopped", "SIGTERM: stopped by its launcher (torchrun's agent stops every worker "
                      "when one of them failed or the job re-forms)")


def test_the_killed_rank_is_the_only_silent_one_when_its_launcher_stopped_the_others():
    """A client that says its launcher stopped it (client/_sigterm.py): ranks that were cut
    off in a collective are no longer silent, so the dead one is named without an address,
    on its own node or with some peers that lost it first."""
    ends = {r: STOPPED for r in range(8) if r != 4}
    end = judge(1, range(8), ends, HOSTS)
    assert end.gone == (4,) and end.signalled == (0, 1, 2, 3, 5, 6, 7) and end.silent == (4,)
    assert end.words() == ("rank 4 on node2 ended without a word (killed, out of memory, or "
                           "lost with its node); ranks 0-3,5-7 were stopped by a signal "
                           "after it")
    mixed = {**{r: STOPPED for r in (0, 1, 2, 7)}, **ENDS}
    assert judge(1, range(8), mixed, HOSTS).gone == (4,)
    assert judge(1, range(8), mixed, HOSTS).evidence()["signalled_ranks"] == [0, 1, 2, 7]


def test_a_teardown_without_a_silent_rank_or_with_a_crash_names_nobody():
    everyone = {r: STOPPED for r in range(8)}  # the job itself stopped, every rank said so
    assert judge(1, range(8), everyone, HOSTS).gone == ()
    crash = {**{r: STOPPED for r in range(8) if r not in (2, 4)},
             2: ("failed", "torch.OutOfMemoryError: CPU out of memory.")}
    assert judge(1, range(8), crash, HOSTS).gone == ()  # the crash is the cause, said as such
    ctrl_c = {r: ("stopped", "KeyboardInterrupt: ") for r in range(8) if r != 4}
    assert judge(1, range(8), ctrl_c, HOSTS).gone == ()  # a person's stop is no teardown
    two_nodes = {r: STOPPED for r in range(8) if r not in (4, 6)}
    assert judge(1, range(8), two_nodes, HOSTS).gone == ()  # silent on two nodes: unknown


def _relaunched(gone: list[int], attempt: int) -> Finding:
    return Finding(type="relaunched", severity=Severity.WARNING, run_id="r", step=10,
                   message="relaunched", evidence={"gone_ranks": gone,
                                                   "ended_attempt": attempt})


def test_one_dead_rank_once_is_suspect_every_rank_or_again_sick():
    book = NodeVerdicts()
    assert book.observe(_relaunched([4], 1), HOSTS, {}) == "node2"
    assert book.verdict("node2", (4, 5)).state == "suspect"
    assert book.observe(_relaunched([4], 1), HOSTS, {}) is None  # said again
    assert book.observe(_relaunched([5], 2), HOSTS, {}) == "node2"
    assert (book.verdict("node2", (4, 5)).state, book.verdict("node2", (4, 5)).cause) == (
        "sick", "gone")
    other = NodeVerdicts()
    other.observe(_relaunched([6, 7], 1), HOSTS, {})
    assert other.verdict("node3", (6, 7)).state == "sick"
    assert other.verdict("node0", (0, 1)).state == "healthy"
    restored = NodeVerdicts()
    restored.restore(book.to_dict())
    assert restored.dead == {"node2": [1, 2]}


def test_a_node_of_one_rank_losing_it_once_is_suspect_not_a_machine_gone():
    """One rank per node (a process a node): its one silent death is one process dead, as
    one rank of many is; the machine is judged gone only when it happens again."""
    hosts = {r: f"node{r}" for r in range(3)}
    book = NodeVerdicts()
    assert book.observe(_relaunched([1], 1), hosts, {}) == "node1"
    verdict = book.verdict("node1", (1,))
    assert (verdict.state, verdict.cause) == ("suspect", "gone"), verdict
    assert "the machine went" not in verdict.why, verdict
    book.observe(_relaunched([1], 2), hosts, {})
    assert book.verdict("node1", (1,)).state == "sick"
