"""A node whose link is capped is named ``network-slow`` from the nodes' TCP round-trip
times (issue 44; cluster/tcp_probe.py, runs/network_slow.py), on the namespace cluster:
three nodes, one sidecar each (its probe reading ``ss`` in its node's network namespace),
a torchrun job of a rank per node passing its all-reduce round gloo's ring. Node 0's link
is capped with ``tc tbf`` on both ends: every rank's step slows alike (per-rank timings
cannot name the link), but the pairs with node 0 in them measure a long round trip and the
pair without it does not. Node 0 is the hard case: the leader's own node (its figures come
from its own probe, its address from its own sample) and the rendezvous stores' host (its
peers' request/response connections to it measure answer times, not the link). The leader
names node 0, and no other node, network-slow."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from tests.eventually import eventually
from tests.netcluster import Cluster
from tests.netcluster.elastic import ElasticJob

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

RUN = "netslow"
CAPPED = 0


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, privileged: None) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("netslow"), nodes=3) as made:
        made.start_sidecars({"cluster": {"tcp_probe": True,
                                          "tcp_probe_interval_seconds": 1.0}})
        yield made


def _verdicts(cluster: Cluster) -> dict[str, dict[str, Any]]:
    assert cluster.sidecars is not None
    got = cluster.sidecars.get(0, f"/v1/runs/{RUN}/nodes")
    return {v["node"]: v for v in got.get("nodes", [])}


def test_the_capped_node_and_no_other_is_named_network_slow(cluster: Cluster) -> None:
    job: ElasticJob = cluster.elastic_job(
        RUN, steps=10**6, nproc_per_node=1, checkpoint_every=1000, max_restarts=0,
        script_args=["--step-time=0.05", "--width=128", "--layers=2", "--batch=64",
                     "--watchdog-floor=60", "--collective-timeout=600"])
    job.start()
    try:
        job.wait_step(20, timeout=400)

        def heard() -> dict[str, dict[str, Any]]:
            found = _verdicts(cluster)
            assert len(found) == 3, found
            return found
        before = eventually(heard, timeout=60, interval=1.0, what="three nodes judged")
        assert not any(v["cause"] == "network-slow" for v in before.values()), \
            json.dumps(before, indent=1)

        cluster.faults.cap_link(CAPPED, rate="5mbit", burst="32kb", latency="400ms")

        def sick() -> dict[str, dict[str, Any]]:
            found = _verdicts(cluster)
            assert (found[f"node{CAPPED}"]["state"], found[f"node{CAPPED}"]["cause"]) == (
                "sick", "network-slow"), json.dumps(found, indent=1)
            return found
        named = eventually(sick, timeout=300, interval=1.0, what=f"node{CAPPED} sick",
                           context=job.logs)
    finally:
        cluster.faults.reset()
        job.kill()
    # Once node 0's link is measured slow, no other node is network-slow (a straggler's
    # "late to the all-reduce" elsewhere is the ring waiting for that link).
    others = {n: (v["state"], v["cause"]) for n, v in _verdicts(cluster).items()
              if n != f"node{CAPPED}"}
    assert all(cause != "network-slow" for _, cause in others.values()), \
        json.dumps(named, indent=1)
    why = named[f"node{CAPPED}"]["why"]
    assert "its link is slow" in why and "node1, node2" in why, why
