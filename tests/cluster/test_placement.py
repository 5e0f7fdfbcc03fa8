"""Which sidecar leads a run, from what each rank's client says of its node, and whom a
sidecar may forward to: its own configuration decides, never a client's word alone."""

from __future__ import annotations

import pytest

from monitor_agent.cluster.placement import leader_of
from monitor_agent.cluster.settings import ClusterSettings
from monitor_agent.records.types import ClusterPlacement

PORT = 9400
NODE1 = ClusterPlacement(node_rank=1, nodes=2, local_world_size=8,
                         leader_url="http://gpu-node-0:9400")
JOB = ClusterSettings(master_addr="gpu-node-0")  # the sidecar's own MASTER_ADDR


def test_node_0_leads_and_a_single_node_job_judges_alone():
    assert leader_of(ClusterPlacement(0, 2, 8, "http://gpu-node-0:9400"), JOB, PORT) is None
    assert leader_of(ClusterPlacement(0, 1), JOB, PORT) is None
    assert leader_of(None, JOB, PORT) is None


def test_other_nodes_follow_the_client_given_leader_unless_the_sidecar_says_otherwise():
    assert leader_of(NODE1, JOB, PORT) == "http://gpu-node-0:9400"
    assert leader_of(NODE1, ClusterSettings(leader_url="http://10.1.2.3:9500/"), PORT) == \
        "http://10.1.2.3:9500"
    assert leader_of(NODE1, ClusterSettings(enabled=False, master_addr="gpu-node-0"),
                     PORT) is None


def test_a_sidecar_told_its_leader_follows_it_as_node_0_too():
    """A re-rendezvous that left the leader's own machine out makes another machine node
    0: a sidecar whose ``cluster.leader_url`` names the leader keeps following it (one
    brain), and a single-node job still judges alone."""
    told = ClusterSettings(leader_url="http://10.1.2.3:9500")
    assert leader_of(ClusterPlacement(0, 2, 8, "http://gpu-node-1:9400"), told, PORT) == \
        "http://10.1.2.3:9500"
    assert leader_of(ClusterPlacement(0, 1), told, PORT) is None


@pytest.mark.parametrize("url, why", [
    (None, "MASTER_ADDR unset"),
    ("gpu-node-0:9400", "must be an http:// or https:// URL"),
    ("http://gpu-node-0:9400/v1/evil", "must be an http:// or https:// URL"),
])
def test_a_leader_url_that_cannot_be_one_is_refused_saying_why(url, why):
    with pytest.raises(ValueError, match=why):
        leader_of(ClusterPlacement(1, 2, leader_url=url), JOB, PORT)


@pytest.mark.parametrize("url", [
    "http://attacker:9400",            # a host the sidecar was never told of
    "http://127.0.0.1:9555",           # loopback, but another port: another process
    "http://gpu-node-0:9555",          # the job's host at another port
    "http://10.0.0.66:9400",           # a private address is not the job's
])
def test_a_leader_the_sidecar_did_not_choose_is_refused(url):
    with pytest.raises(ValueError, match="may not forward to"):
        leader_of(ClusterPlacement(1, 2, leader_url=url), JOB, PORT)


def test_loopback_at_the_own_port_and_listed_leaders_pinned_by_port():
    loop = ClusterPlacement(1, 2, leader_url="http://localhost:9400")
    assert leader_of(loop, ClusterSettings(), PORT) == "http://localhost:9400"
    listed = ClusterSettings(leader_hosts=["gpu-node-0", "10.0.0.5:9500"])
    assert leader_of(NODE1, listed, PORT) == "http://gpu-node-0:9400"
    assert leader_of(ClusterPlacement(1, 2, leader_url="http://10.0.0.5:9500"), listed,
                     PORT) == "http://10.0.0.5:9500"
    for url in ("http://10.0.0.5:9400", "http://gpu-node-0:9500"):
        with pytest.raises(ValueError, match="may not forward to"):
            leader_of(ClusterPlacement(1, 2, leader_url=url), listed, PORT)


def test_a_malformed_leader_hosts_entry_is_refused_by_name():
    with pytest.raises(ValueError, match="'node:x' is not 'host' or 'host:port'"):
        ClusterSettings(leader_hosts=["node:x"])


def test_a_domain_wildcard_admits_any_node_0_of_the_job_and_nothing_else():
    """A relaunch after an elastic re-rendezvous may name another node 0."""
    job = ClusterSettings(leader_hosts=["*.train-gpt.ns.svc"])
    for node0 in ("train-gpt-0", "train-gpt-3"):
        url = f"http://{node0}.train-gpt.ns.svc:9400"
        assert leader_of(ClusterPlacement(1, 3, leader_url=url), job, PORT) == url
    for url in ("http://train-gpt.ns.svc.evil.com:9400", "http://x.train-gpt.ns.svc:9555",
                "http://other.ns.svc:9400"):
        with pytest.raises(ValueError, match="may not forward to"):
            leader_of(ClusterPlacement(1, 3, leader_url=url), job, PORT)
