"""The nodes a run leader hears from: whose view of the run it has, and whose it lacks.

Each node sidecar reports for the runs it follows at least every ``heartbeat_seconds``
(cluster/link.py), with its node rank and ranks. A node not heard from for
``peer_timeout_seconds`` (or never, once the run is older than the grace a first report
needs) leaves the leader with a partial view: its pages say so and it takes no action
(a rollback decided without a node's ranks could send them somewhere else), and its hang
judgement calls the node's ranks unreachable rather than gone.

    >>> roster = Roster()
    >>> roster.expect(nodes=2, local_world_size=2)
    >>> roster.heard(1, "f00d", "gpu-node-1", [2, 3], now=100.0)
    >>> roster.partial(now=101.0, timeout=3.0, started=90.0) is None
    True
    >>> print(roster.partial(now=110.0, timeout=3.0, started=90.0))
    node 1 (gpu-node-1, ranks 2-3) not heard from for 10 s
    >>> sorted(roster.unreachable(now=110.0, timeout=3.0, started=90.0))
    [2, 3]
"""

from __future__ import annotations

from dataclasses import dataclass, field

START_GRACE_SECONDS = 10.0
"""A node never heard from is missed only once the run is this old here (and at least a
few peer timeouts): its sidecar may still be starting, or its ranks' first batch on its
way."""


@dataclass(slots=True)
class NodeSeen:
    node_rank: int
    sidecar: str
    host: str | None
    heard: float
    ranks: set[int] = field(default_factory=set)


@dataclass(slots=True)
class Roster:
    """One run's nodes as its leader hears them (node 0 is the leader's own)."""

    nodes: dict[int, NodeSeen] = field(default_factory=dict)
    expected: int = 1
    attempt: int = 0  # the run's attempt whose run records said ``expected`` (0: unknown)
    local_world_size: int | None = None
    local: set[int] = field(default_factory=lambda: {0})  # nodes of this sidecar's own ranks
    # When the job last re-formed (a new attempt: its nodes and their ranks may differ): a
    # node not heard since is missed only after the first-report grace from then.
    since: float = 0.0

    def reformed(self, now: float) -> None:
        """A new attempt of the run settled: what was heard of its nodes is the old job's
        (a node left out, node ranks renumbered); each node's next heartbeat says where it
        is, and the new attempt's run records how many there are (``expect``)."""
        self.nodes.clear()
        self.since = now

    def expect(self, nodes: int, local_world_size: int | None = None) -> None:
        """The job has ``nodes`` nodes (its placing run record: ``Placement.place``, which
        starts a new roster when a re-formed job's attempt settles)."""
        self.expected = max(self.expected, nodes)
        if local_world_size is not None:
            self.local_world_size = local_world_size

    def heard(self, node_rank: int, sidecar: str, host: str | None, ranks: list[int],
              now: float) -> None:
        seen = self.nodes.get(node_rank)
        if seen is None:
            seen = self.nodes[node_rank] = NodeSeen(node_rank, sidecar, host, now)
        seen.sidecar, seen.heard = sidecar, now
        seen.host = host or seen.host
        seen.ranks.update(ranks)

    def missing(self, now: float, timeout: float, started: float) -> list[tuple[int, float | None]]:
        """(node rank, when last heard or None) of every node whose view the leader lacks."""
        grace = max(START_GRACE_SECONDS, 3 * timeout)
        started = max(started, self.since)
        out: list[tuple[int, float | None]] = []
        for node in range(self.expected):
            if node in self.local:
                continue
            seen = self.nodes.get(node)
            if seen is None:
                if now - started >= grace:
                    out.append((node, None))
            elif now - seen.heard >= timeout:
                out.append((node, seen.heard))
        return out

    def ranks_of(self, node: int) -> set[int]:
        seen = self.nodes.get(node)
        if seen is not None and seen.ranks:
            return set(seen.ranks)
        if self.local_world_size:
            return set(range(node * self.local_world_size, (node + 1) * self.local_world_size))
        return set()

    def unreachable(self, now: float, timeout: float, started: float) -> set[int]:
        """Ranks of the nodes not heard from: silent because the leader cannot hear them,
        not (as far as it knows) because their processes are gone."""
        out: set[int] = set()
        for node, _ in self.missing(now, timeout, started):
            out |= self.ranks_of(node)
        return out

    def partial(self, now: float, timeout: float, started: float) -> str | None:
        """Why the leader's view of the run is partial, or None when it hears every node."""
        missing = self.missing(now, timeout, started)
        if not missing:
            return None
        parts = []
        for node, heard in missing[:8]:
            seen = self.nodes.get(node)
            who = [seen.host] if seen is not None and seen.host else []
            ranks = sorted(self.ranks_of(node))
            if ranks:
                who.append(f"rank{'s' if len(ranks) > 1 else ''} {span(ranks)}")
            named = f"node {node}" + (f" ({', '.join(who)})" if who else "")
            when = "never heard from" if heard is None else \
                f"not heard from for {now - heard:.0f} s"
            parts.append(f"{named} {when}")
        more = f" and {len(missing) - 8} more nodes" if len(missing) > 8 else ""
        return "; ".join(parts) + more


def span(ranks: list[int]) -> str:
    """"2-3", "0, 2, 5-7": ranks as people read them."""
    out: list[str] = []
    start = prev = None
    for r in sorted(ranks):
        if start is None:
            start = prev = r
        elif prev is not None and r == prev + 1:
            prev = r
        else:
            out.append(str(start) if start == prev else f"{start}-{prev}")
            start = prev = r
    if start is not None:
        out.append(str(start) if start == prev else f"{start}-{prev}")
    return ", ".join(out)
