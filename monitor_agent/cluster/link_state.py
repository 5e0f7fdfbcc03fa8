"""How a node sidecar's link to each run leader stands: answering, or away since when.

The link thread (link.py) writes it after each exchange; the engine reads it when it
routes a finding (forward to the leader, or page here saying the view is partial). One
writer, plain attributes: a reader sees the old or the new value, and either is fine
for a decision that the next exchange revisits.

    >>> book = LinkBook(timeout=3.0)
    >>> link = book.get("http://node-0:9400")
    >>> link.failed(100.0, "connection refused"); book.lost("http://node-0:9400", now=101.0)
    False
    >>> book.lost("http://node-0:9400", now=103.5)
    True
    >>> print(book.why("http://node-0:9400", now=103.5))
    the run's leader http://node-0:9400 has not answered for 4 s (connection refused)
    >>> link.answered(104.0, sidecar="a1b2"); book.lost("http://node-0:9400", now=104.0)
    False
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class LinkState:
    """One leader as seen from here."""

    leader: str
    last_ok: float | None = None
    failing_since: float | None = None
    error: str | None = None
    sidecar: str | None = None     # the leader's id, from its last answer
    is_self: bool = False          # the "leader" is this very sidecar (it leads the run)

    def answered(self, now: float, sidecar: str | None = None) -> None:
        self.last_ok, self.failing_since, self.error = now, None, None
        if sidecar is not None:
            self.sidecar = sidecar

    def failed(self, now: float, error: str) -> None:
        if self.failing_since is None:
            self.failing_since = now
        self.error = error


class LinkBook:
    """Every leader this sidecar forwards to, by URL."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._links: dict[str, LinkState] = {}
        # The link thread's wake-up (cluster/link.py): the engine queued something.
        self.on_queued: Callable[[], None] | None = None

    def queued(self) -> None:
        if self.on_queued is not None:
            self.on_queued()

    def get(self, leader: str) -> LinkState:
        link = self._links.get(leader)
        if link is None:
            link = self._links[leader] = LinkState(leader)
        return link

    def all(self) -> list[LinkState]:
        return list(self._links.values())

    def lost(self, leader: str, now: float) -> bool:
        """Away for ``timeout`` seconds: what is owed to it is paged here meanwhile."""
        link = self._links.get(leader)
        return (link is not None and link.failing_since is not None
                and now - link.failing_since >= self.timeout)

    def is_self(self, leader: str) -> bool:
        link = self._links.get(leader)
        return link is not None and link.is_self

    def why(self, leader: str, now: float) -> str:
        link = self.get(leader)
        since = now - link.failing_since if link.failing_since is not None else 0.0
        return (f"the run's leader {leader} has not answered for {since:.0f} s"
                + (f" ({link.error})" if link.error else ""))
