"""The node verdict (runs/node_verdict.py): each node healthy, suspect or sick with a cause
class, from the findings a run's leader makes; silent corruption told from bad data; the
ski-rental price of leaving a node out."""

from __future__ import annotations

from typing import Any

from monitor_agent.records.types import Finding, Severity
from monitor_agent.runs.node_verdict import DEFAULT_RESTART_SECONDS, NodeVerdicts, price

HOSTS = {r: f"node{r // 2}" for r in range(8)}  # four nodes of two ranks


def finding(type_: str, step: int, rank: int = 0, severity: Severity = Severity.WARNING,
            **evidence: Any) -> Finding:
    return Finding(type=type_, severity=severity, run_id="r", step=step, message="m",
                   rank=rank, evidence=evidence)


def states(book: NodeVerdicts) -> dict[str, tuple[str, str | None]]:
    return {v.node: (v.state, v.cause) for v in book.verdicts(HOSTS)}


def test_every_node_is_healthy_with_nothing_against_it():
    assert set(states(NodeVerdicts()).values()) == {("healthy", None)}


def test_a_node_slow_as_a_whole_is_sick_with_the_stragglers_cause_class():
    for cause, klass in (("compute", "compute-slow"), ("collective", "network-slow"),
                         ("data", "input-slow"), ("gpu_throttle", "gpu-hardware")):
        book = NodeVerdicts()
        book.observe(finding("straggler", 40, 4, cause=cause, host="node2", node_ranks="4-5"),
                     HOSTS, {})
        assert states(book)["node2"] == ("sick", klass)
        assert states(book)["node1"] == ("healthy", None)


def test_one_slow_rank_makes_its_node_suspect_and_sick_once_sustained():
    book = NodeVerdicts()
    book.observe(finding("straggler", 40, 3, cause="compute", host="node1"), HOSTS, {})
    assert states(book)["node1"] == ("suspect", "compute-slow")
    book.observe(finding("straggler", 540, 3, cause="compute", host="node1"), HOSTS, {})
    verdict = book.verdict("node1", (2, 3))
    assert (verdict.state, verdict.cause) == ("sick", "compute-slow")
    assert "rank 3 the straggler since step 40" in verdict.words()


def test_a_later_straggler_reading_of_where_the_time_goes_replaces_the_first():
    """A slow loader read first as late to the all-reduce (the first window after the change
    moved the others' waits before its own data times): the fuller window's reading,
    its data loading, names the node's cause, and the node stays sick."""
    book = NodeVerdicts()
    book.observe(finding("straggler", 24, 4, cause="collective", host="node2",
                         node_ranks="4-5"), HOSTS, {})
    assert states(book)["node2"] == ("sick", "network-slow")
    book.observe(finding("straggler", 30, 5, cause="data", host="node2"), HOSTS, {})
    assert states(book)["node2"] == ("sick", "input-slow")
    book.observe(finding("gpu_health", 31, 4, Severity.ERROR, condition="XID 79"), HOSTS, {})
    assert states(book)["node2"] == ("sick", "gpu-hardware")  # other evidence stays apart


def test_a_hard_gpu_error_is_sick_a_warning_suspect_and_the_stronger_cause_names_it():
    book = NodeVerdicts()
    book.observe(finding("gpu_health", 10, 2, condition="pcie_width", node="node1"), HOSTS, {})
    assert states(book)["node1"] == ("suspect", "gpu-hardware")
    book.observe(finding("straggler", 12, 2, cause="compute", host="node1"), HOSTS, {})
    book.observe(finding("gpu_health", 20, 2, Severity.CRITICAL, condition="xid",
                         node="node1"), HOSTS, {})
    assert states(book)["node1"] == ("sick", "gpu-hardware")


def test_every_rank_of_a_node_gone_is_sick_some_of_them_suspect():
    book = NodeVerdicts()
    book.observe(finding("hang", 30, severity=Severity.CRITICAL, gone_ranks=[6, 7],
                         hung_ranks=[0, 1, 2, 3, 4, 5]), HOSTS, {})
    book.observe(finding("hang", 30, severity=Severity.CRITICAL, gone_ranks=[2]), HOSTS, {})
    assert states(book)["node3"] == ("sick", "gone")
    assert states(book)["node1"] == ("suspect", "gone")
    assert book.verdict("node1", (2, 3)).why == "rank 2 of it sent nothing past the limit"
    assert states(book)["node0"] == ("healthy", None)


def test_nan_first_on_one_node_at_two_data_positions_is_silent_corruption():
    book = NodeVerdicts()
    book.observe(finding("nan_inf", 100, 5, Severity.CRITICAL, first_rank=5), HOSTS, {5: 3200})
    assert states(book)["node2"] == ("suspect", "sdc-suspect")
    book.observe(finding("nan_inf", 100, 5, Severity.CRITICAL, first_rank=5), HOSTS, {5: 3200})
    assert states(book)["node2"] == ("suspect", "sdc-suspect")  # the same incident again
    book.observe(finding("nan_inf", 400, 4, Severity.CRITICAL, first_rank=4), HOSTS, {4: 12800})
    verdict = book.verdict("node2", (4, 5))
    assert (verdict.state, verdict.cause) == ("sick", "sdc-suspect")
    assert "two incidents at different data positions (3200 at step 100, 12800 at step " \
        "400)" in verdict.why


def test_nan_through_the_all_reduce_on_one_nodes_ranks_alone_starts_on_that_node():
    """A flip in one node's gradients after the all-reduce: its ranks' grad_norm is inf,
    every local loss finite, the other nodes' ranks still finite (seen on the fault suite:
    nan_inf's first_rank null, first_ranks "2, 3")."""
    book = NodeVerdicts()
    book.observe(finding("nan_inf", 17, 2, Severity.CRITICAL, first_rank=None,
                         first_ranks="2, 3", still_finite="0, 1, 4, 5, 6, 7"),
                 HOSTS, {2: 17})
    assert states(book)["node1"] == ("suspect", "sdc-suspect")
    assert "rank 2" in book.verdict("node1", (2, 3)).why
    book.observe(finding("nan_inf", 90, 2, Severity.CRITICAL, first_rank=None,
                         first_ranks="2, 3"), HOSTS, {2: 90})
    assert states(book)["node1"] == ("sick", "sdc-suspect")  # again, other data
    for lead in ("3, 4", "0, 1, 2, 3, 4, 5, 6, 7", "x"):  # two nodes; every rank; garbage
        other = NodeVerdicts()
        other.observe(finding("nan_inf", 17, 3, Severity.CRITICAL, first_rank=None,
                              first_ranks=lead), HOSTS, {})
        assert set(states(other).values()) == {("healthy", None)}


def test_nan_back_at_the_same_data_position_on_another_node_is_the_datas():
    book = NodeVerdicts()
    book.observe(finding("nan_inf", 100, 5, Severity.CRITICAL, first_rank=5), HOSTS, {5: 3200})
    # the run rolled back and re-read that window on another node: it broke there too
    book.observe(finding("nan_inf", 160, 1, Severity.CRITICAL, first_rank=1), HOSTS, {1: 3200})
    assert set(states(book).values()) == {("healthy", None)}
    assert book.data_note is not None and book.data_note[0] == 160
    assert "the data's, not a node's: NaN first on rank 1 (node0) at data position 3200, " \
        "where the incident at step 100 started on rank 5 (node2)" in book.data_note[1]


def test_every_rank_of_a_node_off_its_peers_loss_at_once_is_silent_corruption():
    """A flipped bit that makes no NaN: the node's replica drifts and its ranks' local loss
    leaves their peers' (rank_outlier); one rank is a suspect (a corrupt shard is not ruled
    out), every rank of the node at once is the node's, and so is the same node again."""
    book = NodeVerdicts()
    book.observe(finding("rank_outlier", 45, 4, since_step=41, window=8), HOSTS, {})
    assert states(book)["node2"] == ("suspect", "sdc-suspect")
    book.observe(finding("rank_outlier", 95, 4, since_step=41, window=8), HOSTS, {})
    assert states(book)["node2"] == ("suspect", "sdc-suspect")  # the same incident again
    book.observe(finding("rank_outlier", 46, 5, since_step=42, window=8), HOSTS, {})
    verdict = book.verdict("node2", (4, 5))
    assert (verdict.state, verdict.cause) == ("sick", "sdc-suspect")
    assert "every rank of it (ranks 4-5) left its peers' at once" in verdict.why
    assert {n: s for n, s in states(book).items() if n != "node2"} == {
        f"node{i}": ("healthy", None) for i in (0, 1, 3)}

    lone = NodeVerdicts()  # one rank, then again in a later incident
    lone.observe(finding("rank_outlier", 45, 2, since_step=41, window=8), HOSTS, {})
    lone.observe(finding("rank_outlier", 47, 6, since_step=43, window=8), HOSTS, {})
    assert states(lone)["node1"] == ("suspect", "sdc-suspect")
    assert states(lone)["node3"] == ("suspect", "sdc-suspect")  # another node: not at once
    lone.observe(finding("rank_outlier", 130, 2, since_step=120, window=8), HOSTS, {})
    assert states(lone)["node1"] == ("sick", "sdc-suspect")
    assert "again" in lone.verdict("node1", (2, 3)).why
    restored = NodeVerdicts()
    restored.restore(lone.to_dict())
    assert restored.outliers == lone.outliers


def test_leaving_a_node_out_pays_once_its_tax_paid_equals_a_restart():
    """Ski rental: measured restarts' median, else the stated default."""
    assert not price(100.0, 3600.0, []).exclude_pays
    assert price(DEFAULT_RESTART_SECONDS, 3600.0, []).exclude_pays
    measured = price(100.0, 3600.0, [60.0, 90.0, 2000.0])
    assert measured.exclude_pays and measured.restart_seconds == 90.0
    assert "measured" in measured.words() and "leaving it out pays" in measured.words()


def test_the_evidence_survives_a_snapshot():
    book = NodeVerdicts()
    book.observe(finding("straggler", 40, 3, cause="collective", host="node1"), HOSTS, {})
    book.observe(finding("nan_inf", 100, 5, Severity.CRITICAL, first_rank=5), HOSTS, {5: 7})
    again = NodeVerdicts()
    again.restore(book.to_dict())
    assert states(again) == states(book)
    assert states(again)["node1"] == ("suspect", "network-slow")
