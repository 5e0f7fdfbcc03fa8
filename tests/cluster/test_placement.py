"""Which sidecar leads a run, from what each rank's client says of its node."""

from __future__ import annotations

import pytest

from monitor_agent.cluster.placement import leader_of
from monitor_agent.cluster.settings import ClusterSettings
from monitor_agent.records.types import ClusterPlacement

NODE1 = ClusterPlacement(node_rank=1, nodes=2, local_world_size=8,
                         leader_url="http://gpu-node-0:9400")


def test_node_0_leads_and_a_single_node_job_judges_alone():
    assert leader_of(ClusterPlacement(0, 2, 8, "http://gpu-node-0:9400"),
                     ClusterSettings()) is None
    assert leader_of(ClusterPlacement(0, 1), ClusterSettings()) is None
    assert leader_of(None, ClusterSettings()) is None


def test_other_nodes_follow_the_client_given_leader_unless_the_sidecar_says_otherwise():
    assert leader_of(NODE1, ClusterSettings()) == "http://gpu-node-0:9400"
    assert leader_of(NODE1, ClusterSettings(leader_url="http://10.1.2.3:9500/")) == \
        "http://10.1.2.3:9500"
    assert leader_of(NODE1, ClusterSettings(enabled=False)) is None


@pytest.mark.parametrize("url, why", [
    (None, "MASTER_ADDR unset"),
    ("gpu-node-0:9400", "must be an http:// or https:// URL"),
    ("http://gpu-node-0:9400/v1/evil", "must be an http:// or https:// URL"),
])
def test_a_leader_url_that_cannot_be_one_is_refused_saying_why(url, why):
    with pytest.raises(ValueError, match=why):
        leader_of(ClusterPlacement(1, 2, leader_url=url), ClusterSettings())


def test_leader_hosts_limits_where_digests_may_go():
    allowed = ClusterSettings(leader_hosts=["gpu-node-0"])
    assert leader_of(NODE1, allowed) == "http://gpu-node-0:9400"
    with pytest.raises(ValueError, match="not in cluster.leader_hosts"):
        leader_of(ClusterPlacement(1, 2, leader_url="http://attacker:9400"), allowed)
