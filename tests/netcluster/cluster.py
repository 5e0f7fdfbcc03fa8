"""A cluster of "nodes" on one machine: Linux network namespaces on a bridge, each with its
own address, hostname and CPU cgroup; optionally a sidecar per node (as docs/scaling-out.md
deploys them), torchrun elastic jobs across the nodes, Slurm, and faults injected for real.

    with Cluster(tmp_path, nodes=3) as cluster:       # namespaces, bridge, cgroups
        cluster.start_sidecars()                      # node i's sidecar: <ip>:9400, node 0 leads
        job = cluster.elastic_job("run-1", steps=60)  # torchrun on every node, c10d on node 0
        job.start()
        job.wait_step(20)
        cluster.faults.kill_rank(node=1)              # SIGKILL: torchrun restarts the group
        job.wait()                                    # every node's torchrun exits 0
    # everything is gone: processes, namespaces, links, qdiscs, cgroups

Needs root (CI runs as root); ``unavailable()`` says why not, for a skip. Teardown runs on
``__exit__``, at interpreter exit (atexit) if a caller forgot, and ``up()`` first sweeps the
leftovers of clusters whose process died (netcluster/sweep.py).
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tests.netcluster import cgroups, network, sweep
from tests.netcluster.names import Names
from tests.netcluster.node import Node

if TYPE_CHECKING:
    from tests.netcluster.elastic import ElasticJob
    from tests.netcluster.faults import Faults
    from tests.netcluster.sidecars import NodeSidecars
    from tests.netcluster.slurm import Slurm


def unavailable() -> str | None:
    """None if this machine can build a cluster, else why not (for a test's skip)."""
    if not sys.platform.startswith("linux"):
        return "needs Linux network namespaces"
    return network.have_tools() or cgroups.available()


class Cluster:
    """``nodes`` namespaces ``node0`` .. ``node<n-1>`` under ``workdir``; see the module."""

    def __init__(self, workdir: Path, nodes: int = 3, names: Names | None = None) -> None:
        if not 1 <= nodes <= 64:
            raise ValueError(f"nodes must be 1..64, got {nodes}")
        self.dir = Path(workdir)
        self.count = nodes
        self.names = names or Names()
        self.nodes: list[Node] = []
        self.bridge_ip = ""
        self.sidecars: NodeSidecars | None = None
        self.jobs: list[ElasticJob] = []
        self.slurm: Slurm | None = None
        self._faults: Faults | None = None
        self._up = False

    # -- lifecycle -------------------------------------------------------------------------
    def up(self) -> Cluster:
        why = unavailable()
        if why:
            raise RuntimeError(f"netcluster: {why}")
        sweep.sweep()
        self.dir.mkdir(parents=True, exist_ok=True)
        atexit.register(self.down)
        self._up = True
        n = self.names
        subnet = network.create_bridge(n.bridge, start=n.pid % 256)
        self.bridge_ip = str(subnet[254])
        hosts = {f"node{i}": str(subnet[i + 1]) for i in range(self.count)}
        hosts["host"] = self.bridge_ip  # the machine's side of the bridge: tests, receivers
        for i in range(self.count):
            self.nodes.append(self._make_node(i, f"node{i}", n.netns(i), n.veth(i),
                                              str(subnet[i + 1]), hosts))
        return self

    def _make_node(self, index: int, hostname: str, netns: str, veth: str, ip: str,
                   hosts: dict[str, str]) -> Node:
        network.add_node(self.names.bridge, netns, veth, ip)
        network.write_hosts(netns, hostname, hosts)
        group = cgroups.NodeCgroup(self.names.prefix, hostname).create()
        return Node(index, hostname, netns, veth, ip, group, self.dir / hostname)

    def down(self) -> None:
        """Stop everything this cluster started and remove all it made; safe to call twice."""
        if not self._up:
            return
        self._up = False
        if self._faults is not None:
            self._faults.stop_controllers()
        for job in self.jobs:
            job.kill()
        if self.slurm is not None:
            self.slurm.stop()
        if self.sidecars is not None:
            self.sidecars.stop()
        for node in self.nodes:
            node.cgroup.kill_all()
            node.reap()
        sweep.remove(sweep.leftovers(self.names.prefix))
        atexit.unregister(self.down)

    def __enter__(self) -> Cluster:
        try:
            return self.up()
        except BaseException:
            self.down()
            raise

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- the pieces --------------------------------------------------------------------------
    @property
    def ips(self) -> list[str]:
        return [node.ip for node in self.nodes]

    def head(self) -> Node:
        """A namespace for the cluster's head services (Slurm's controller), made on first
        use: ``head`` at ``.250`` of the subnet, in a cgroup of its own."""
        for node in self.nodes:
            if node.hostname == "head":
                return node
        hosts = {node.hostname: node.ip for node in self.nodes}
        hosts["host"] = self.bridge_ip
        ip = self.bridge_ip.rsplit(".", 1)[0] + ".250"
        head = self._make_node(-1, "head", self.names.controller_netns,
                               f"{self.names.prefix}hc", ip, {**hosts, "head": ip})
        for node in self.nodes:  # every node resolves the head too
            network.write_hosts(node.netns, node.hostname, {**hosts, "head": ip})
        self.nodes.append(head)
        return head

    @property
    def workers(self) -> list[Node]:
        """The compute nodes (not the head)."""
        return [node for node in self.nodes if node.index >= 0]

    def start_sidecars(self, config: dict[str, Any] | None = None,
                       env: dict[str, str] | None = None) -> NodeSidecars:
        """One ``monitor-agent serve`` per compute node (see netcluster/sidecars.py)."""
        from tests.netcluster.sidecars import NodeSidecars

        self.sidecars = NodeSidecars(self, config or {}, env or {}).start()
        return self.sidecars

    def elastic_job(self, run_id: str, **kw: Any) -> ElasticJob:
        """A torchrun elastic job over the compute nodes (see netcluster/elastic.py)."""
        from tests.netcluster.elastic import ElasticJob

        job = ElasticJob(self, run_id, **kw)
        self.jobs.append(job)
        return job

    @property
    def faults(self) -> Faults:
        from tests.netcluster.faults import Faults

        if self._faults is None:
            self._faults = Faults(self)
        return self._faults

    def start_slurm(self, **kw: Any) -> Slurm:
        """munged, slurmctld on the head and one slurmd per node (netcluster/slurm.py)."""
        from tests.netcluster.slurm import Slurm

        self.slurm = Slurm(self, **kw).start()
        return self.slurm

    def faults_dir(self, node: int) -> Path:
        return self.dir / "faults" / f"node{node}"

    def env(self, node: Node) -> dict[str, str]:
        """What every process of ``node`` that runs our Python needs."""
        here = Path(__file__).resolve()
        repo = here.parents[2]
        path = [str(here.parent / "fake_gpu"), str(repo), str(repo / "client"),
                os.environ.get("PYTHONPATH", "")]
        return {"PYTHONPATH": os.pathsep.join(p for p in path if p),
                "NETCLUSTER_NODE": str(node.index),
                "NETCLUSTER_FAULTS": str(self.faults_dir(node.index)),
                "NO_PROXY": "*", "no_proxy": "*"}

    def leftovers(self) -> sweep.Leftovers:
        """What of this cluster is still on the host (nothing, after ``down()``)."""
        return sweep.leftovers(self.names.prefix)

    def run(self, node: int, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return self.nodes[node].run(argv)

    def remove_workdir(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
