"""The leader names the node common to the slow pairs ``network-slow`` from the TCP figures
its node sidecars send with their exchanges (pipeline/link_figures.py,
runs/network_slow.py). A real leader sidecar over real HTTP; three node sidecars' exchanges
made from loopback addresses of their own (127.0.0.2-4), as the leader tells nodes apart by
the address they connect from; the figures those measured on a namespace cluster whose
node's link was capped with ``tc tbf`` (tests/runs/test_network_slow.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from monitor_agent.settings import load_settings
from tests.eventually import eventually
from tests.live_server import LiveServer

pytestmark = pytest.mark.timeout(120)
TOKEN = "write-token-0123456789abcdef"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
RUN, NODES, PER_NODE = "ring", 4, 2
SLOW, FAST = {"rtt_ms": 68.29, "rttvar_ms": 8.168}, {"rtt_ms": 0.124, "rttvar_ms": 0.073}


def _address(node: int) -> str:
    return f"127.0.0.{node + 1}"


def _records(node: int, leader: str, steps: range) -> list[dict[str, Any]]:
    ranks = range(node * PER_NODE, (node + 1) * PER_NODE)
    cluster = {"node_rank": node, "nodes": NODES, "local_world_size": PER_NODE,
               "leader_url": leader}
    out: list[dict[str, Any]] = [
        {"kind": "run", "run_id": RUN, "rank": r, "time": 1000.0, "attempt": f"t{r}",
         "labels": {"hostname": f"gpu-node-{node}"}, "cluster": cluster,
         "hardware": {"world_size": NODES * PER_NODE}} for r in ranks] if steps.start == 1 else []
    out += [{"kind": "step", "run_id": RUN, "rank": r, "step": s, "time": 1000.0 + s,
             "attempt": f"t{r}", "loss": 2.0} for s in steps for r in ranks]
    return out


def _exchange(url: str, settings: Any, node: int, records: list[dict[str, Any]],
              links: list[dict[str, Any]] | None) -> httpx.Response:
    body: dict[str, Any] = {
        "sidecar": f"node-{node}", "records": records, "findings": [],
        "runs": [{"run_id": RUN, "node": node, "host": f"gpu-node-{node}",
                  "ranks": list(range(node * PER_NODE, (node + 1) * PER_NODE)),
                  "known_action": 0}]}
    if links is not None:
        body["links"] = links
    transport = httpx.HTTPTransport(local_address=_address(node))
    with httpx.Client(transport=transport, timeout=30) as client:
        return client.post(url + "/v1/peer/digests", json=body, headers={
            "Authorization": f"Bearer {settings.peer_token_value()}"})


def _ring(slow: int | None) -> dict[int, list[dict[str, Any]]]:
    """Each node's figures to the next round the ring (it sends to it): slow when either
    end is the ``slow`` node."""
    return {n: [{"address": _address((n + 1) % NODES), "connections": 1, "retransmits": 0,
                 **(SLOW if slow in (n, (n + 1) % NODES) else FAST)}]
            for n in range(1, NODES)}


def _verdicts(url: str) -> dict[str, tuple[str, str | None]]:
    got = httpx.get(f"{url}/v1/runs/{RUN}/nodes", headers=AUTH, timeout=10).json()
    return {v["node"]: (v["state"], v["cause"]) for v in got["nodes"]}


@pytest.fixture
def leader(tmp_path: Path):
    # The leader's own probe off: its host's real connections are not this test's ring.
    settings = load_settings(data_dir=tmp_path / "data", token=TOKEN,
                             cluster={"tcp_probe": False, "tcp_probe_interval_seconds": 0.5})
    with LiveServer(settings) as srv:
        own = _records(0, srv.url, range(1, 6))
        r = httpx.post(srv.url + "/v1/records", json={"records": own}, headers=AUTH,
                       timeout=30)
        assert r.status_code == 200, r.text
        for node in range(1, NODES):
            r = _exchange(srv.url, settings, node, _records(node, srv.url, range(1, 6)), None)
            assert r.status_code == 200 and r.json()["accepted"] == 6 * PER_NODE, r.text
        yield srv, settings


def test_the_node_common_to_the_slow_pairs_is_suspect_then_sick_network_slow(leader):
    srv, settings = leader
    for node, links in _ring(None).items():
        assert _exchange(srv.url, settings, node, [], links).status_code == 200
    assert {s for s, _ in _verdicts(srv.url).values()} == {"healthy"}

    def judged(want: str) -> dict[str, tuple[str, str | None]]:
        for node, links in _ring(2).items():
            r = _exchange(srv.url, settings, node, [], links)
            assert r.status_code == 200, r.text
        got = _verdicts(srv.url)
        assert got["gpu-node-2"] == (want, "network-slow"), got
        return got

    first = eventually(lambda: judged("suspect"), timeout=30, what="node 2 suspect")
    assert {n: s for n, (s, _) in first.items() if n != "gpu-node-2"} == {
        "gpu-node-0": "healthy", "gpu-node-1": "healthy", "gpu-node-3": "healthy"}
    sick = eventually(lambda: judged("sick"), timeout=60, what="node 2 sick")
    assert sum(s != "healthy" for s, _ in sick.values()) == 1
    why = httpx.get(f"{srv.url}/v1/runs/{RUN}/nodes", headers=AUTH, timeout=10).json()
    words = next(v["why"] for v in why["nodes"] if v["node"] == "gpu-node-2")
    assert "gpu-node-1, gpu-node-3" in words and "68.3 ms" in words, words


def test_a_node_whose_pairs_spend_longer_sending_each_byte_is_network_slow(leader):
    """Round trips alike everywhere; the time each pair's connection spent sending what it
    moved (``sending_ms``, over the wire with the figures) is what names node 2, once the
    other pairs' samples have shown their own noise."""
    srv, settings = leader

    def ring(slow: int | None) -> dict[int, list[dict[str, Any]]]:
        return {n: [{**link, **FAST, "bytes": 40_000_000,
                     "sending_ms": 2400.0 if slow in (n, (n + 1) % NODES) else 800.0}
                    for link in links] for n, links in _ring(None).items()}

    for _ in range(10):
        for node, links in ring(None).items():
            assert _exchange(srv.url, settings, node, [], links).status_code == 200
    assert {s for s, _ in _verdicts(srv.url).values()} == {"healthy"}

    def judged() -> dict[str, tuple[str, str | None]]:
        for node, links in ring(2).items():
            r = _exchange(srv.url, settings, node, [], links)
            assert r.status_code == 200, r.text
        got = _verdicts(srv.url)
        assert got["gpu-node-2"] == ("sick", "network-slow"), got
        return got

    sick = eventually(judged, timeout=60, what="node 2 sick")
    assert sum(s != "healthy" for s, _ in sick.values()) == 1
    why = httpx.get(f"{srv.url}/v1/runs/{RUN}/nodes", headers=AUTH, timeout=10).json()
    words = next(v["why"] for v in why["nodes"] if v["node"] == "gpu-node-2")
    assert "sent data at 133 Mbit/s-133 Mbit/s while sending, the pairs without it at " \
        "400 Mbit/s-400 Mbit/s" in words, words


def test_a_nodes_figures_name_only_the_nodes_at_the_addresses_it_lists(leader):
    """Figures about addresses that are no node of the run (a file server, another job)
    are left out: node 2's figures alone to an unknown address name nobody."""
    srv, settings = leader
    for _ in range(3):
        for node in range(1, NODES):
            links = [{"address": "10.99.0.1", "connections": 3, "retransmits": 0, **SLOW}]
            assert _exchange(srv.url, settings, node, [], links).status_code == 200
    assert {s for s, _ in _verdicts(srv.url).values()} == {"healthy"}
