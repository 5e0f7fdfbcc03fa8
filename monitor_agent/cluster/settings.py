"""How a sidecar finds and talks to the leader of a multi-node run (``cluster:`` in the
sidecar's config, env ``MONITOR_AGENT_CLUSTER__...``).

Nothing here needs setting in the common case: every rank's client tells its sidecar where
its node sits in the job (``torchrun``'s ``GROUP_RANK``/``GROUP_WORLD_SIZE``, or the
launcher's equivalents) and where node 0's sidecar is (``MASTER_ADDR`` and the port of its
own sidecar). ``leader_url`` overrides that, for a leader that is not on ``MASTER_ADDR``
or not on the same port as every node's sidecar (several sidecars on one host, in tests).

    >>> ClusterSettings().peer_timeout_seconds
    3.0
    >>> ClusterSettings(leader_url="ftp://node-0:9400")
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for ClusterSettings
    leader_url
      Value error, must be an http:// or https:// URL, e.g. http://node-0:9400 ...
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator

from monitor_agent.cluster.drain import DrainSettings


class ClusterSettings(BaseModel):
    """The knobs of the run leader and the node sidecars that forward to it."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=True, description="Forward multi-node runs to their leader. Off: every "
        "sidecar judges only its own ranks (and says nothing of the others).")
    leader_url: str | None = Field(
        default=None, description="The leader sidecar's base URL for every multi-node run "
        "whose ranks report here from a node other than 0. Unset: the URL each rank's "
        "client derives (http://$MASTER_ADDR:<the port of its own sidecar>).")
    leader_hosts: list[str] = Field(
        default_factory=list, description="Leaders a client-derived leader URL may name "
        "besides the defaults (loopback and master_addr, each at this sidecar's own port): "
        "'host' (at this sidecar's port), 'host:port', or '*.domain' (any name under it: a "
        "job whose node 0 may change between attempts). A leader URL comes from a rank's "
        "run record, so anyone holding the write token could name any host: the sidecar "
        "forwards only to a leader its own configuration allows (cluster/placement.py).")
    master_addr: str | None = Field(
        default_factory=lambda: os.environ.get("MASTER_ADDR") or None, description="The "
        "job's rendezvous host (default: this sidecar's own MASTER_ADDR environment "
        "variable, as the launcher or the Pod spec sets it for the ranks): a client-derived "
        "leader URL on it, at this sidecar's port, is followed without listing it.")
    peer_token: SecretStr | None = Field(
        default=None, description="The credential of the leader link: what a node sidecar "
        "sends its run's leader and what the leader's POST /v1/peer/digests requires. "
        "Unset: derived from the write token (an HMAC of it: the token itself is never "
        "sent to a leader, but any holder of the token can derive it); set it, the same on "
        "every node's sidecar and given to no job, so that only sidecars speak for a node.")
    peer_token_file: Path | None = Field(
        default=None, description="File holding peer_token (a mounted Secret); read on "
        "every use, so a rotated file applies at once.")
    peer_timeout_seconds: float = Field(
        default=3.0, gt=0, le=300, description="A leader that has not acknowledged for this "
        "long is lost: the node sidecar pages on its own, saying the run's view is partial; "
        "a node not heard from for this long makes the leader's view partial.")
    heartbeat_seconds: float = Field(
        default=1.0, gt=0, le=60, description="A node sidecar reports to its leader at least "
        "this often while it follows a running run (the leader's proof that it is there).")
    post_timeout_seconds: float = Field(
        default=2.0, gt=0, le=60, description="One POST to the leader.")
    batch_max_items: int = Field(
        default=4000, ge=1, le=100_000, description="Digests and findings per POST.")
    drain: DrainSettings = Field(
        default_factory=DrainSettings, description="What this sidecar does when a run's "
        "leader leaves its node out (cluster/drain.py): say so at GET /v1/node, and run "
        "the configured drain (slurm's scontrol, or a command of the operator's).")
    tcp_probe: bool = Field(
        default=False, description="Sample this host's established TCP connections to "
        "other machines (ss -tin, iproute2) every tcp_probe_interval_seconds and send "
        "their round-trip times to the run's leader, which names the node common to the "
        "slow pairs network-slow (cluster/tcp_probe.py, runs/network_slow.py). Off (the "
        "default until its precision is measured beyond the namespace cluster), or "
        "without ss: no network-slow verdict from this node's figures.")
    tcp_probe_interval_seconds: float = Field(
        default=5.0, ge=0.5, le=300, description="How often the TCP probe samples; a "
        "connection counts when it sent data within one interval (an idle one's RTT is "
        "stale). The leader judges a node suspect once its link has been slow for three "
        "intervals, sick for six, and forgets a node's figures after three (set it alike "
        "on every node's sidecar).")
    end_stopped_ranks: bool = Field(
        default=True, description="When a run's restart is decided, SIGKILL this node's "
        "own ranks whose process is stopped (SIGSTOP: it cannot leave with exit 75 by "
        "itself), checked by pid, start time and boot id (cluster/stopped_rank.py), so "
        "the launcher relaunches without its grace (torchrun: 30 s).")
    uplink_max_rows: int = Field(
        default=500_000, ge=1000, description="Digests and findings kept for every leader "
        "together (about 300 bytes a step digest) while leaders are away or slow; past it "
        "(or past uplink_max_bytes) items go in this order, oldest first within each: step "
        "digests, the other digests but run, checkpoint and end records, findings already "
        "paged here, run/checkpoint/end digests, the rest (storage/uplink.py); counted in "
        "monitor_agent_uplink_dropped_total.")
    uplink_max_bytes: int = Field(
        default=128 * 1024 * 1024, ge=1024 * 1024, description="Bytes of queued digests and "
        "findings kept for every leader together (uplink_max_rows says what goes first).")

    @field_validator("leader_hosts")
    @classmethod
    def _hosts(cls, value: list[str]) -> list[str]:
        for entry in value:
            host_port(entry, 1)  # ValueError naming the entry
        return value

    @field_validator("leader_url")
    @classmethod
    def _http(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        return checked_url(value.strip())


def checked_url(value: str) -> str:
    """``value`` without a trailing slash if it is an http(s) URL with a host, else
    ValueError saying what a leader URL looks like."""
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError("must be an http:// or https:// URL, e.g. http://node-0:9400 "
                         f"(got {value[:200]!r})")
    return value.rstrip("/")


def host_port(entry: str, default_port: int) -> tuple[str, int]:
    """A ``leader_hosts`` entry as (host, port): 'gpu-node-0' at ``default_port``,
    'gpu-node-0:9500', '[fd00::1]:9400'; lower-cased (host names are case-blind).

        >>> host_port("GPU-Node-0", 9400), host_port("10.0.0.5:9500", 9400)
        (('gpu-node-0', 9400), ('10.0.0.5', 9500))
        >>> host_port("node:x", 9400)
        Traceback (most recent call last):
        ValueError: leader_hosts: 'node:x' is not 'host' or 'host:port'
    """
    try:
        parts = urlsplit(f"//{entry.strip()}")
        host, port = parts.hostname, parts.port
    except ValueError:
        host = None
    if not host or parts.path or parts.query:
        raise ValueError(f"leader_hosts: {entry[:200]!r} is not 'host' or 'host:port'")
    return host.lower(), port or default_port
