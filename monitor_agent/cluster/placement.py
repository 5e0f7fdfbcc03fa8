"""Which sidecar leads a run: node 0's. A node sidecar forwards to it; the rest judge alone.

Every rank's client says where its node sits in the job (the run record's ``cluster``,
docs/format.md): ``node_rank`` and ``nodes`` from the launcher (``torchrun``'s
``GROUP_RANK``/``GROUP_WORLD_SIZE``, PyTorchJob's ``PET_NODE_RANK``/``PET_NNODES``,
SLURM's ``SLURM_NODEID``/``SLURM_NNODES``), and ``leader_url``, the sidecar on
``MASTER_ADDR`` at the port of its own sidecar (every node runs one, on the same port).
The sidecar of node 0 leads; any other follows ``leader_url``, unless the sidecar's own
``cluster.leader_url`` says otherwise (a leader elsewhere, or several sidecars on one host).

    >>> from monitor_agent.records.types import ClusterPlacement
    >>> node1 = ClusterPlacement(node_rank=1, nodes=2, leader_url="http://node-0:9400")
    >>> leader_of(node1, ClusterSettings())
    'http://node-0:9400'
    >>> leader_of(node1, ClusterSettings(leader_url="http://10.0.0.5:9500"))
    'http://10.0.0.5:9500'
    >>> leader_of(ClusterPlacement(node_rank=0, nodes=2), ClusterSettings()) is None   # leads
    True
    >>> leader_of(node1, ClusterSettings(leader_hosts=["gpu-node-0"]))  # not allowed
    Traceback (most recent call last):
    ...
    ValueError: cluster: the leader host 'node-0' is not in cluster.leader_hosts
"""

from __future__ import annotations

from urllib.parse import urlsplit

from monitor_agent.cluster.settings import ClusterSettings, checked_url
from monitor_agent.records.types import ClusterPlacement


def leader_of(placement: ClusterPlacement | None, settings: ClusterSettings) -> str | None:
    """The leader URL a run's records go to from here, or None when this sidecar leads
    the run or it is not a multi-node run. ValueError (saying why) for a leader URL the
    settings do not allow: the run is then judged here alone."""
    if not settings.enabled or placement is None:
        return None
    if placement.nodes <= 1 or placement.node_rank == 0:
        return None
    if settings.leader_url is not None:
        return settings.leader_url
    if not placement.leader_url:
        raise ValueError(f"cluster: node {placement.node_rank}'s ranks name no leader "
                         "(MASTER_ADDR unset); set cluster.leader_url on this sidecar")
    try:
        url = checked_url(placement.leader_url)
    except ValueError as exc:
        raise ValueError(f"cluster: the ranks' leader_url {exc}") from None
    host = urlsplit(url).hostname or ""
    if settings.leader_hosts and host not in settings.leader_hosts:
        raise ValueError(f"cluster: the leader host {host!r} is not in cluster.leader_hosts")
    return url
