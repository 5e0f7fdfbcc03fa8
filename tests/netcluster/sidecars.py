"""One sidecar per node, as docs/scaling-out.md deploys them: ``monitor-agent serve`` on
every node at the same port, its own data directory, every rank's client posting to its
own node's sidecar on loopback; node 0's sidecar leads the run, the others forward to it.

``sidecar_config`` is the one place a node sidecar's settings are made (the leader link
among them), so a change of how the link is configured is made here once.
"""

from __future__ import annotations

import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import httpx
import yaml

from tests.sidecar_process import SidecarProcess

if TYPE_CHECKING:
    from tests.netcluster.cluster import Cluster
    from tests.netcluster.node import Node

PORT = 9400  # the same on every node, as a DaemonSet or a node's systemd unit has it


def sidecar_config(cluster: Cluster, node: Node, token: str,
                   extra: dict[str, Any]) -> dict[str, Any]:
    """``node``'s sidecar config: the run's write token, a fast tick, and the leader link
    stated outright (node 0's sidecar at its address and port; only that host may be the
    leader) rather than taken from what the ranks derive; ``extra`` merged over it."""
    leader = cluster.workers[0]
    config: dict[str, Any] = {
        "token": token,
        "tick_interval_seconds": 0.5,
        "cluster": {"leader_hosts": [leader.ip]},
    }
    if node is not leader:
        config["cluster"]["leader_url"] = f"http://{leader.ip}:{PORT}"
    return _merged(config, extra)


def _merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merged(out[key], value)
        else:
            out[key] = value
    return out


class NodeSidecars:
    """The sidecars of a cluster's compute nodes; ``[i]`` is node i's ``SidecarProcess``
    (``url`` reaches it from the host: ``http://<node ip>:9400``)."""

    def __init__(self, cluster: Cluster, extra: dict[str, Any], env: dict[str, str]) -> None:
        self.cluster = cluster
        self.token = secrets.token_hex(16)
        self.procs: list[SidecarProcess] = []
        for node in cluster.workers:
            config = node.dir / "sidecar.yaml"
            node.dir.mkdir(parents=True, exist_ok=True)
            config.write_text(yaml.safe_dump(sidecar_config(cluster, node, self.token, extra)))
            self.procs.append(SidecarProcess(
                node.dir / "sidecar", config=config, env={**cluster.env(node), **env},
                port=PORT, host="0.0.0.0", url_host=node.ip, wrap=node.command))

    def __getitem__(self, node: int) -> SidecarProcess:
        return self.procs[node]

    def __len__(self) -> int:
        return len(self.procs)

    @property
    def leader(self) -> SidecarProcess:
        return self.procs[0]

    def client_env(self) -> dict[str, str]:
        """What a rank on any node needs to report: its own node's sidecar on loopback."""
        return {"MONITOR_AGENT_URL": f"http://127.0.0.1:{PORT}",
                "MONITOR_AGENT_TOKEN": self.token}

    def start(self, timeout: float = 120.0) -> NodeSidecars:
        """Every node's sidecar, booted in parallel as nodes do (several on a shared 2-core
        machine take far longer than one: ``timeout`` each, scaled)."""
        with ThreadPoolExecutor(len(self.procs)) as pool:
            list(pool.map(lambda p: p.start(timeout), self.procs))
        return self

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()

    def get(self, node: int, path: str, **params: Any) -> Any:
        """GET ``path`` of node ``node``'s sidecar, as JSON (raises on an HTTP error)."""
        r = httpx.get(self.procs[node].url + path, params=params, timeout=10,
                      headers={"Authorization": f"Bearer {self.token}"})
        r.raise_for_status()
        return r.json()

    def logs(self) -> str:
        return "\n".join(f"--- sidecar node{i} ---\n{p.log()[-3000:]}"
                         for i, p in enumerate(self.procs))


