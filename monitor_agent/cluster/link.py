"""A node sidecar's link to its run leaders: one thread that forwards, reports and adopts.

For each leader (the sidecar of node 0 of a run this one follows) the thread:

1. posts what is queued for it (``storage/uplink.py``: digests of this node's records,
   this node's findings), gzip, in id order, at most ``batch_max_items`` at a time, and
   at least every ``heartbeat_seconds`` while it follows a run of that leader, so the
   leader knows the node is there (``POST /v1/peer/digests``, api/peer.py);
2. on the answer, deletes what the leader stored and keeps the actions the leader decided
   for those runs (its rollback plans, its stops) for this node's ranks to read;
3. when the leader has not answered for ``peer_timeout_seconds`` (killed, restarting, cut
   off), pages here every finding still owed to it, each saying the run's view is partial,
   and goes on queueing: the leader catches up when it is back, and records those pages
   without paging them again.

The training step never waits on any of it: the engine only queues (in the transaction
that stores a batch's findings) and wakes this thread.

The thread reaches the engine and alerting through a ``Port`` (the app wires one that runs
the engine's side on its thread); a fake one and a local HTTP leader are enough to test it.
"""

from __future__ import annotations

import gzip
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.cluster.settings import ClusterSettings
from monitor_agent.records import wire
from monitor_agent.storage.uplink import PAGED

log = logging.getLogger(__name__)

PEER_PATH = "/v1/peer/digests"


class OwedItem(Protocol):
    """A queued digest or finding (``storage.uplink.UplinkItem``)."""

    @property
    def id(self) -> int: ...
    @property
    def run_id(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def body(self) -> bytes: ...
    @property
    def flags(self) -> int: ...


class FollowedRun(Protocol):
    """A run this sidecar follows (``pipeline.engine.PeerRun``)."""

    @property
    def run_id(self) -> str: ...
    @property
    def node(self) -> int: ...
    @property
    def host(self) -> str | None: ...
    @property
    def ranks(self) -> tuple[int, ...]: ...


class Port(Protocol):
    """What the link needs of the sidecar (the app runs the engine's side on its thread)."""

    def followed(self) -> list[tuple[str, FollowedRun]]: ...

    def leaders(self) -> list[str]: ...

    def batch(self, leader: str, limit: int) -> list[OwedItem]: ...

    def ack(self, ids: list[int]) -> None: ...

    def page_stranded(self, leader: str, now: float, why: str | None) -> int: ...

    def known_action(self, run_id: str) -> int: ...

    def adopt(self, run_id: str, actions: list[dict[str, Any]], leader: str) -> None: ...

    def hand_over(self, run_id: str) -> None: ...


class LinkMetrics(Protocol):
    """The link's self-metrics (metrics/sidecar.py's ``SelfMetrics`` has them)."""

    leader_exchanges: Any
    uplink_bytes: Any


class LeaderLink:
    """The forwarding thread of a node sidecar (see the module docstring)."""

    def __init__(self, settings: ClusterSettings, book: LinkBook, sidecar: str, port: Port,
                 token: Callable[[], str | None], metrics: LinkMetrics | None = None,
                 clock: Callable[[], float] = time.time,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.settings, self.book, self.sidecar, self.port = settings, book, sidecar, port
        self.token, self.metrics, self.clock = token, metrics, clock
        self._client = httpx.Client(transport=transport, timeout=settings.post_timeout_seconds)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_post: dict[str, float] = {}
        self._limit: dict[str, int] = {}  # items per post, halved after a 413
        book.on_queued = self.wake

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="leader-link")
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._client.close()

    def wake(self) -> None:
        """Something was queued: send it now rather than at the next heartbeat."""
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            busy = False
            try:
                busy = self.run_once()
            except Exception:  # noqa: BLE001 - the link must outlive any one bad exchange
                log.exception("leader link: an exchange failed; retrying")
            if not busy:
                self._wake.wait(self.settings.heartbeat_seconds)

    def run_once(self) -> bool:
        """One exchange with every leader that is owed something or is due a heartbeat;
        True when a leader has more queued than one post took."""
        by_leader: dict[str, list[FollowedRun]] = {}
        for leader, run in self.port.followed():
            by_leader.setdefault(leader, []).append(run)
        busy = False
        for leader in sorted(set(by_leader) | set(self.port.leaders())):
            busy |= self._exchange(leader, by_leader.get(leader, []))
        return busy

    def _exchange(self, leader: str, runs: list[FollowedRun]) -> bool:
        link = self.book.get(leader)
        now = self.clock()
        if link.is_self:  # never followed: whatever was queued is judged here after all
            self.port.page_stranded(leader, now, None)
            items = self.port.batch(leader, self.settings.batch_max_items)
            self.port.ack([q.id for q in items])
            return len(items) >= self.settings.batch_max_items
        limit = self._limit.get(leader, self.settings.batch_max_items)
        items = self.port.batch(leader, limit)
        if not items and (not runs or now - self._last_post.get(leader, -1e18)
                          < self.settings.heartbeat_seconds):
            return False
        self._last_post[leader] = now
        body = self._body(runs, items)
        outcome = self._post(leader, body)
        if isinstance(outcome, str):
            self._failed(leader, outcome)
            return False
        status, answer = outcome
        if status == 413 and limit > 1:
            self._limit[leader] = max(1, limit // 2)
            return True
        if status in (200, 422):  # 422: every item refused for good; sending again won't help
            self._answered(leader, answer, items, runs)
            return len(items) >= limit
        self._failed(leader, f"HTTP {status}: {str(answer.get('detail', ''))[:200]}")
        return False

    def _body(self, runs: list[FollowedRun], items: list[OwedItem]) -> bytes:
        records = [wire.loads(q.body) for q in items if q.kind == "record"]
        findings = [{"flags": q.flags, "finding": wire.loads(q.body)}
                    for q in items if q.kind == "finding"]
        names = {r.run_id for r in runs}
        # A run owed items but no longer in memory here still says which node it is from.
        extra: list[dict[str, Any]] = [{"run_id": run_id, "node": -1, "host": None, "ranks": []}
                 for run_id in sorted({q.run_id for q in items} - names)]
        return wire.dumps({
            "sidecar": self.sidecar,
            "runs": [{"run_id": r.run_id, "node": r.node, "host": r.host,
                      "ranks": list(r.ranks), "known_action": self.port.known_action(r.run_id)}
                     for r in runs] + extra,
            "records": records, "findings": findings,
        })

    def _post(self, leader: str, body: bytes) -> tuple[int, dict[str, Any]] | str:
        packed = gzip.compress(body, compresslevel=1)
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        token = self.token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            resp = self._client.post(leader + PEER_PATH, content=packed, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {str(exc)[:200]}"
        if self.metrics is not None:
            self.metrics.uplink_bytes.inc(len(packed))
        try:
            answer = resp.json()
        except ValueError:
            answer = {}
        return resp.status_code, answer if isinstance(answer, dict) else {}

    def _answered(self, leader: str, answer: dict[str, Any], items: list[OwedItem],
                  runs: list[FollowedRun]) -> None:
        link = self.book.get(leader)
        sidecar = answer.get("sidecar")
        link.answered(self.clock(), sidecar if isinstance(sidecar, str) else None)
        if self.metrics is not None:
            self.metrics.leader_exchanges.labels(outcome="ok").inc()
        if sidecar == self.sidecar:
            log.info("the leader %s of %d run(s) is this sidecar: judging them here", leader,
                     len(runs))
            link.is_self = True
            return  # nothing was stored there twice: it is this very database
        self.port.ack([q.id for q in items])
        # What this node paged while the leader was away is the leader's now (it recorded
        # it as told): one resolve, the leader's, closes each incident.
        for run_id in sorted({q.run_id for q in items if q.kind == "finding"
                              and q.flags & PAGED}):
            self.port.hand_over(run_id)
        for run_id, about in (answer.get("runs") or {}).items():
            actions = about.get("actions") if isinstance(about, dict) else None
            if isinstance(run_id, str) and isinstance(actions, list) and actions:
                self.port.adopt(run_id, [a for a in actions if isinstance(a, dict)], leader)

    def _failed(self, leader: str, why: str) -> None:
        now = self.clock()
        link = self.book.get(leader)
        if link.failing_since is None:
            log.warning("run leader %s does not answer (%s); its runs' findings are paged "
                        "here after %g s", leader, why, self.settings.peer_timeout_seconds)
        link.failed(now, why)
        if self.metrics is not None:
            self.metrics.leader_exchanges.labels(outcome="failed").inc()
        if self.book.lost(leader, now):
            paged = self.port.page_stranded(leader, now, self.book.why(leader, now))
            if paged:
                log.warning("paged %d finding(s) here: %s", paged, self.book.why(leader, now))
