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

from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator

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
        default_factory=list, description="Hosts a client-derived leader URL may name "
        "(empty: any). A leader URL comes from the training job's environment, so anyone "
        "holding the write token can point this sidecar's digests at a host; list the job's "
        "node names to rule that out.")
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
    uplink_max_rows: int = Field(
        default=500_000, ge=1000, description="Digests kept for a leader that is away "
        "(about 300 bytes each); past it the oldest step digests go (findings, hang, "
        "checkpoint, run and end records are kept), counted in "
        "monitor_agent_uplink_dropped_total.")

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
