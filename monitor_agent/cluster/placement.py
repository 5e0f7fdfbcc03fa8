"""Which sidecar leads a run: node 0's. A node sidecar forwards to it; the rest judge alone.

Every rank's client says where its node sits in the job (the run record's ``cluster``,
docs/format.md): ``node_rank`` and ``nodes`` from the launcher (``torchrun``'s
``GROUP_RANK``/``GROUP_WORLD_SIZE``, PyTorchJob's ``PET_NODE_RANK``/``PET_NNODES``,
SLURM's ``SLURM_NODEID``/``SLURM_NNODES``), and ``leader_url``, the sidecar on
``MASTER_ADDR`` at the port of its own sidecar (every node runs one, on the same port).
The sidecar of node 0 leads; any other follows ``leader_url``, unless the sidecar's own
``cluster.leader_url`` says otherwise (a leader elsewhere, or several sidecars on one host).
A sidecar whose ``cluster.leader_url`` names another one follows it even when its ranks are
node 0's: after an elastic re-rendezvous that left the leader's own machine out, node 0 is
another machine, and the run keeps its one leader (pipeline/placement.py ``Placement.place``).

    >>> from monitor_agent.records.types import ClusterPlacement
    >>> node1 = ClusterPlacement(node_rank=1, nodes=2, leader_url="http://node-0:9400")
    >>> leader_of(node1, ClusterSettings(master_addr="node-0"), own_port=9400)
    'http://node-0:9400'
    >>> leader_of(node1, ClusterSettings(leader_url="http://10.0.0.5:9500"), own_port=9400)
    'http://10.0.0.5:9500'
    >>> leader_of(ClusterPlacement(node_rank=0, nodes=2), ClusterSettings(), 9400) is None
    True
    >>> leader_of(ClusterPlacement(node_rank=0, nodes=2),     # a re-formed job's node 0
    ...           ClusterSettings(leader_url="http://10.0.0.5:9500"), own_port=9400)
    'http://10.0.0.5:9500'

Whom a sidecar forwards to is its own decision, never a client's word alone: a rank's
``leader_url`` (a run record: anyone holding the write token can send one) is followed only
when this sidecar's configuration allows it: ``cluster.leader_url`` names the leader
outright; otherwise the URL's host and port must be loopback or ``cluster.master_addr``
(the job's rendezvous host, from this sidecar's own environment: the launcher or the Pod
spec set it for the sidecar as for the ranks) at this sidecar's own port (every node's
sidecar listens on the same one), or an entry of ``cluster.leader_hosts`` ('host' at this
port, or 'host:port'). Anything else is refused: the run is judged here alone, and the log
says how to allow the leader. What the link sends is its own credential
(``cluster.peer_token``), never the write token.

    >>> leader_of(node1, ClusterSettings(), own_port=9400)           # not allowed
    Traceback (most recent call last):
    ...
    ValueError: cluster: the ranks name the leader node-0:9400, which this sidecar may not forward to: ...
    >>> leader_of(node1, ClusterSettings(master_addr="node-0"), own_port=9500)  # port pinned
    Traceback (most recent call last):
    ...
    ValueError: cluster: the ranks name the leader node-0:9400, which this sidecar may not forward to: ...
    >>> leader_of(node1, ClusterSettings(leader_hosts=["node-0:9400"]), own_port=9500)
    'http://node-0:9400'

A job whose node 0 may change between attempts (an elastic re-rendezvous picks another)
lists its nodes, or the domain they share (``'*.train-gpt.default.svc'``: any name under
it, at the sidecar's port)::

    >>> pod3 = ClusterPlacement(node_rank=1, nodes=3,
    ...                         leader_url="http://train-gpt-2.train-gpt.default.svc:9400")
    >>> leader_of(pod3, ClusterSettings(leader_hosts=["*.train-gpt.default.svc"]), 9400)
    'http://train-gpt-2.train-gpt.default.svc:9400'
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from monitor_agent.cluster.settings import ClusterSettings, checked_url, host_port
from monitor_agent.records.types import ClusterPlacement

LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def leader_of(placement: ClusterPlacement | None, settings: ClusterSettings,
              own_port: int) -> str | None:
    """The leader URL a run's records go to from here, or None when this sidecar leads
    the run or it is not a multi-node run. ValueError (saying why) for a leader URL the
    settings do not allow: the run is then judged here alone."""
    if not settings.enabled or placement is None:
        return None
    if placement.nodes <= 1:
        return None
    if settings.leader_url is not None:
        # Named outright, it leads whatever node rank a re-rendezvous gives these ranks
        # (node 0 too: the leader's own machine may be left out of the job).
        return settings.leader_url
    if placement.node_rank == 0:
        return None
    if not placement.leader_url:
        raise ValueError(f"cluster: node {placement.node_rank}'s ranks name no leader "
                         "(MASTER_ADDR unset); set cluster.leader_url on this sidecar")
    try:
        url = checked_url(placement.leader_url)
        parts = urlsplit(url)
        host, port = (parts.hostname or "").lower(), parts.port
    except ValueError as exc:
        raise ValueError(f"cluster: the ranks' leader_url {exc}") from None
    port = port or (443 if parts.scheme == "https" else 80)
    if not allowed(host, port, settings, own_port):
        raise ValueError(
            f"cluster: the ranks name the leader {host}:{port}, which this sidecar may not "
            f"forward to: a leader is loopback or cluster.master_addr "
            f"({settings.master_addr or 'unset'}) at this sidecar's port {own_port}, or "
            "listed in cluster.leader_hosts ('host' or 'host:port'); or set "
            "cluster.leader_url")
    return url


def allowed(host: str, port: int, settings: ClusterSettings, own_port: int) -> bool:
    """Whether this sidecar may forward to a leader at ``host``:``port`` (module docstring)."""
    if port == own_port and (_loopback(host) or (
            settings.master_addr is not None and host == settings.master_addr.lower())):
        return True
    for entry in settings.leader_hosts:
        listed, listed_port = host_port(entry, own_port)
        if listed_port == port and (host == listed or (
                listed.startswith("*.") and host.endswith(listed[1:]))):
            return True
    return False


def _loopback(host: str) -> bool:
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
