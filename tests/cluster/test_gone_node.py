"""A rank SIGKILLed under torchrun names its node ``gone`` on real parts (issue 44): two
real sidecars on loopback (node 0's, the run's leader, and node 1's), fed what a 2-node x
2-rank job's clients send, each rank to its own node's sidecar. Rank 2 (node 1) dies
without a word; ranks 0, 1 and 3 end ``failed`` with gloo's "Connection closed by peer";
torchrun relaunches the job and the new attempt's steps arrive. The leader names rank 2 on
gpu-node-1 in the page that closes the crash, judges gpu-node-1 ``gone`` on its API, and
never names the peers that lost it as the cause."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.cluster.test_one_brain import _post, _texts, sidecar
from tests.eventually import eventually
from tests.receivers import Receiver
from tests.sidecar_process import free_port

pytestmark = pytest.mark.timeout(120)
RUN = "gone"
TORCHRUN = {"name": "torchrun", "restarts": True, "restart_count": 0, "max_restarts": 3}
LOST = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection "
        "closed by peer [10.0.0.2]:21170. This is typically caused by a remote worker crashing.")


def _records(token: str, rank: int, steps: range, leader: str) -> list[dict[str, Any]]:
    node = rank // 2
    out: list[dict[str, Any]] = [{
        "kind": "run", "run_id": RUN, "rank": rank, "time": 1.0, "attempt": f"{token}{rank}",
        "launcher": TORCHRUN, "hardware": {"reporting_ranks": 4, "world_size": 4},
        "labels": {"hostname": f"gpu-node-{node}"},
        "cluster": {"node_rank": node, "nodes": 2, "local_world_size": 2,
                    "leader_url": leader}}]
    out += [{"kind": "step", "run_id": RUN, "rank": rank, "step": s, "time": 100.0 + s,
             "loss": 2.0, "attempt": f"{token}{rank}"} for s in steps]
    return out


def _launch(urls: dict[int, str], token: str, steps: range, leader: str) -> None:
    for node, url in urls.items():
        _post(url, [r for rank in (2 * node, 2 * node + 1)
                    for r in _records(token, rank, steps, leader)])


def test_a_rank_killed_without_a_word_names_its_node_gone_on_the_leader(tmp_path):
    port = free_port()
    with Receiver("slack") as slack, Receiver("slack") as slack1, \
            sidecar(tmp_path / "n0", slack, port=port) as lead, \
            sidecar(tmp_path / "n1", slack1, leader_hosts=[f"127.0.0.1:{port}"]) as n1:
        urls = {0: lead.url, 1: n1.url}
        _launch(urls, "a", range(1, 31), lead.url)

        def heard() -> None:
            detail = httpx.get(f"{lead.url}/v1/runs/{RUN}", timeout=5).json()
            assert detail["last_step"] == 30 and len(detail["ranks"]) == 4, detail
        eventually(heard, timeout=30, what="the job heard by its leader")

        # Rank 2's process is killed: no end record. Its peers' collectives lose it.
        for rank, url in ((0, lead.url), (1, lead.url), (3, n1.url)):
            _post(url, [{"kind": "end", "run_id": RUN, "rank": rank, "step": 30,
                         "time": 131.0, "attempt": f"a{rank}", "status": "failed",
                         "error": LOST}])
        crash = eventually(lambda: [t for t in _texts(slack) if "lost a peer" in t] or None,
                           timeout=30, what="the crash page")
        assert "not the cause" in crash[0], crash

        def relaunch() -> list[str]:
            _launch(urls, "b", range(21, 26), lead.url)
            said = [t for t in _texts(slack) if "ended without a word" in t]
            assert said, _texts(slack)
            return said
        said = eventually(relaunch, timeout=45, what="the relaunch named")
        assert "rank 2 on gpu-node-1 ended without a word" in said[0], said
        assert "ranks 0-1,3 lost it as a peer" in said[0], said
        assert "Node verdict: node gpu-node-1: suspect (gone)" in said[0], said

        nodes = httpx.get(f"{lead.url}/v1/runs/{RUN}/nodes", timeout=5).json()["nodes"]
        assert [(v["node"], v["state"], v["cause"]) for v in nodes] == [
            ("gpu-node-0", "healthy", None), ("gpu-node-1", "suspect", "gone")]
        assert "rank 2 of it died without a word" in nodes[1]["words"]
