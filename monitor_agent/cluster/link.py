"""A node sidecar's link to its run leaders: exchanges that forward, report and adopt.

For each leader (the sidecar of node 0 of a run this one follows) an exchange:

1. posts what is queued for it (``storage/uplink.py``: digests of this node's records,
   this node's findings), gzip, in id order, at most ``batch_max_items`` at a time, and
   at least every ``heartbeat_seconds`` while it follows a run of that leader, so the
   leader knows the node is there (``POST /v1/peer/digests``, api/peer.py), with the
   link's own credential (``cluster.peer_token``, never the write token), with this
   host's TCP figures when the probe took a new sample (cluster/tcp_probe.py);
2. on the answer, deletes what the leader stored and keeps the actions the leader decided
   for those runs (its rollback plans, its stops) for this node's ranks to read; the items
   of a run the leader does not take (``deferred``: it does not lead it, yet) stay queued
   and go again at the next heartbeat;
3. when the leader has not answered for ``peer_timeout_seconds`` (killed, restarting, cut
   off), or has not taken a run for that long, pages here every finding still owed to it
   for those runs, each saying the run's view is partial, and goes on queueing: the
   leader catches up when it is back, and records those pages without paging them again.

**No leader delays another.** Each leader's exchange runs on a thread of its own (a pool
of ``MAX_EXCHANGES``, one exchange at a time per leader), under ``post_timeout_seconds``
(connect, send, each read): a leader that never answers holds only its own. The leaders
a sidecar may forward to are the ones its configuration allows (cluster/placement.py:
``leader_url``, ``master_addr``, the ``leader_hosts`` entries, loopback at its own port),
so there are never more of them than that, whatever run records name; past
``MAX_EXCHANGES`` they take turns, the one tried longest ago first. Twenty dead leaders
leave a real run's forwarding as it was (``bench/chaos.py --sections peer``). Paging what
a lost leader is owed does not wait for an exchange with it.

The training step never waits on any of it: the engine only queues (in the transaction
that stores a batch's findings) and wakes the link.

The link reaches the engine and alerting through a ``Port`` (the app wires one that runs
the engine's side on its thread); a fake one and a local HTTP leader are enough to test it.
"""

from __future__ import annotations

import functools
import gzip
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import httpx

from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.cluster.settings import ClusterSettings
from monitor_agent.cluster.tcp_probe import LinkSample
from monitor_agent.records import wire
from monitor_agent.storage.uplink import PAGED

log = logging.getLogger(__name__)

PEER_PATH = "/v1/peer/digests"
MAX_EXCHANGES = 64
"""Exchanges in flight at once, each with its own leader (threads of the link's pool,
started as needed): more than the leaders a sidecar's configuration allows."""


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

    def batch(self, leader: str, limit: int, skip: list[str]) -> list[OwedItem]: ...

    def ack(self, ids: list[int]) -> None: ...

    def page_stranded(self, leader: str, now: float, why: str | None,
                      run_id: str | None = None) -> int: ...

    def known_action(self, run_id: str) -> int: ...

    def adopt(self, run_id: str, actions: list[dict[str, Any]], leader: str) -> None: ...

    def hand_over(self, run_id: str) -> None: ...


class LinkMetrics(Protocol):
    """The link's self-metrics (metrics/sidecar.py's ``SelfMetrics`` has them)."""

    leader_exchanges: Any
    uplink_bytes: Any


class LeaderLink:
    """The forwarding of a node sidecar (see the module docstring)."""

    def __init__(self, settings: ClusterSettings, book: LinkBook, sidecar: str, port: Port,
                 token: Callable[[], str | None], metrics: LinkMetrics | None = None,
                 clock: Callable[[], float] = time.time,
                 transport: httpx.BaseTransport | None = None,
                 links: Callable[[], tuple[int, LinkSample] | None] | None = None) -> None:
        self.settings, self.book, self.sidecar, self.port = settings, book, sidecar, port
        # This host's latest TCP sample (cluster/tcp_probe.py), sent once to each leader.
        self.links = links
        self._links_sent: dict[str, int] = {}
        self.token, self.metrics, self.clock = token, metrics, clock
        self._client = httpx.Client(transport=transport, timeout=settings.post_timeout_seconds,
                                    limits=httpx.Limits(max_connections=MAX_EXCHANGES))
        self._pool = ThreadPoolExecutor(MAX_EXCHANGES, thread_name_prefix="leader-link")
        self._flying: dict[str, Future[bool]] = {}  # leader -> its exchange in flight
        self._tried: dict[str, float] = {}  # leader -> when its last exchange began
        self._wake = threading.Event()
        self._queued = 0  # how many times something was queued (``wake``)
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_post: dict[str, float] = {}
        self._limit: dict[str, int] = {}  # items per post, halved after a 413
        # leader -> run -> since when the leader does not take the run (``deferred``); each
        # leader's own dict is touched only by its exchange, one at a time.
        self._deferred: dict[str, dict[str, float]] = {}
        book.on_queued = self.wake

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="leader-link")
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()

    def wake(self) -> None:
        """Something was queued: look again now (an exchange under way when it was looks
        again as soon as it ends: ``_done``)."""
        self._queued += 1
        self._wake.set()

    def _loop(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            try:
                self.run_once()
            except Exception:  # noqa: BLE001 - the link must outlive any one bad round
                log.exception("leader link: a round failed; retrying")
            self._wake.wait(self.settings.heartbeat_seconds)

    def run_once(self) -> None:
        """Start an exchange with every leader that has none in flight (it posts if the
        leader is owed something or due a heartbeat), the one tried longest ago first;
        page what the leaders that are lost are owed."""
        by_leader: dict[str, list[FollowedRun]] = {}
        for leader, run in self.port.followed():
            by_leader.setdefault(leader, []).append(run)
        leaders = set(by_leader) | set(self.port.leaders())
        for leader in list(self._flying):
            if self._flying[leader].done():
                del self._flying[leader]
        self._page_lost(leaders)
        for leader in sorted(leaders - set(self._flying), key=lambda x: self._tried.get(x, 0.0)):
            if len(self._flying) >= MAX_EXCHANGES:
                break
            self._tried[leader] = self.clock()
            future = self._pool.submit(self._exchange, leader, by_leader.get(leader, []))
            future.add_done_callback(functools.partial(self._done, queued=self._queued))
            self._flying[leader] = future

    def _done(self, future: Future[bool], queued: int) -> None:
        """An exchange ended: look again at once if it left more to send, or if something
        was queued while it was under way (it may be owed to this very leader)."""
        try:
            more = future.result()
        except Exception:  # noqa: BLE001 - one exchange's bug is logged, not the link's end
            log.exception("leader link: an exchange failed; retrying")
            more = False
        if more or self._queued != queued:
            self._wake.set()

    def _page_lost(self, leaders: set[str]) -> None:
        """Page here what leaders that are lost are owed, whether or not an exchange with
        them is under way (a dead leader's takes ``post_timeout_seconds``)."""
        now = self.clock()
        for leader in leaders:
            if self.book.lost(leader, now):
                paged = self.port.page_stranded(leader, now, self.book.why(leader, now))
                if paged:
                    log.warning("paged %d finding(s) here: %s", paged,
                                self.book.why(leader, now))

    def _exchange(self, leader: str, runs: list[FollowedRun]) -> bool:
        """One exchange with ``leader``; True when it has more queued than one post took."""
        link = self.book.get(leader)
        now = self.clock()
        if link.is_self:  # never followed: whatever was queued is judged here after all
            self.port.page_stranded(leader, now, None)
            items = self.port.batch(leader, self.settings.batch_max_items, [])
            self.port.ack([q.id for q in items])
            return len(items) >= self.settings.batch_max_items
        limit = self._limit.get(leader, self.settings.batch_max_items)
        items = self.port.batch(leader, limit, self._resting(leader, now))
        if not items and (not runs or now - self._last_post.get(leader, -1e18)
                          < self.settings.heartbeat_seconds):
            return False
        self._last_post[leader] = now
        body = self._body(runs, items, self._new_links(leader))
        outcome = self._post(leader, body)
        if isinstance(outcome, str):
            self._failed(leader, outcome)
            return False
        status, answer = outcome
        if status == 413 and limit > 1:
            self._limit[leader] = max(1, limit // 2)
            return True
        if status in (200, 422):  # 422: every item refused for good; sending again won't help
            taken = self._answered(leader, answer, items, runs)
            return taken >= limit
        self._failed(leader, f"HTTP {status}: {str(answer.get('detail', ''))[:200]}")
        return False

    def _resting(self, leader: str, now: float) -> list[str]:
        """Runs the leader did not take at its last answer, less than a heartbeat ago:
        their items wait for the next heartbeat rather than go again at once."""
        if now - self._last_post.get(leader, 0.0) >= self.settings.heartbeat_seconds:
            return []
        return list(self._deferred.get(leader, {}))

    def _new_links(self, leader: str) -> list[dict[str, Any]] | None:
        """This host's TCP figures, if the probe took a sample since the last one sent
        to ``leader``."""
        latest = self.links() if self.links is not None else None
        if latest is None or self._links_sent.get(leader) == latest[0]:
            return None
        self._links_sent[leader] = latest[0]
        return [p.to_dict() for p in latest[1].peers]

    def _body(self, runs: list[FollowedRun], items: list[OwedItem],
              links: list[dict[str, Any]] | None = None) -> bytes:
        records = [wire.loads(q.body) for q in items if q.kind == "record"]
        findings = [{"flags": q.flags, "finding": wire.loads(q.body)}
                    for q in items if q.kind == "finding"]
        names = {r.run_id for r in runs}
        # A run owed items but no longer in memory here: the leader knows this sidecar's
        # node for it from its heartbeats (node -1: "the one you heard me as").
        extra: list[dict[str, Any]] = [{"run_id": run_id, "node": -1, "host": None, "ranks": []}
                 for run_id in sorted({q.run_id for q in items} - names)]
        extra_links = {} if links is None else {"links": links}
        return wire.dumps({
            **extra_links,
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
                  runs: list[FollowedRun]) -> int:
        """Take the leader's answer; how many items it took (stored, or refused for good)."""
        link = self.book.get(leader)
        sidecar = answer.get("sidecar")
        now = self.clock()
        link.answered(now, sidecar if isinstance(sidecar, str) else None)
        if self.metrics is not None:
            self.metrics.leader_exchanges.labels(outcome="ok").inc()
        if sidecar == self.sidecar:
            log.info("the leader %s of %d run(s) is this sidecar: judging them here", leader,
                     len(runs))
            link.is_self = True
            return 0  # nothing was stored there twice: it is this very database
        deferred = answer.get("deferred")
        deferred = {str(k): str(v) for k, v in deferred.items()} \
            if isinstance(deferred, dict) else {}
        taken = [q for q in items if q.run_id not in deferred]
        self.port.ack([q.id for q in taken])
        self._defer(leader, deferred, {q.run_id for q in items} | {r.run_id for r in runs},
                    now)
        # What this node paged while the leader was away is the leader's now (it recorded
        # it as told): one resolve, the leader's, closes each incident.
        for run_id in sorted({q.run_id for q in taken if q.kind == "finding"
                              and q.flags & PAGED}):
            self.port.hand_over(run_id)
        # Actions only for the runs this sidecar follows with this leader (an answer may
        # name any run: a leader decides for its own runs, never for another's).
        ours = {r.run_id for r in runs}
        runs_answered = answer.get("runs")
        for run_id, about in (runs_answered if isinstance(runs_answered, dict) else {}).items():
            actions = about.get("actions") if isinstance(about, dict) else None
            if run_id in ours and isinstance(actions, list) and actions:
                self.port.adopt(run_id, [a for a in actions if isinstance(a, dict)], leader)
        return len(taken)

    def _defer(self, leader: str, deferred: dict[str, str], sent: set[str],
               now: float) -> None:
        """Keep track of the runs ``leader`` does not take: one it has not taken for
        ``peer_timeout_seconds`` has what it is owed paged here (a partial view)."""
        mine = self._deferred.setdefault(leader, {})
        for run_id in sent - set(deferred):
            mine.pop(run_id, None)
        for run_id, why in deferred.items():
            if run_id not in sent:
                continue
            since = mine.setdefault(run_id, now)
            if now - since >= self.settings.peer_timeout_seconds:
                reason = (f"the run's leader {leader} has not taken it for "
                          f"{now - since:.0f} s ({why[:200]})")
                if self.port.page_stranded(leader, now, reason, run_id):
                    log.warning("paged findings of run %s here: %s", run_id, reason)

    def _failed(self, leader: str, why: str) -> None:
        now = self.clock()
        link = self.book.get(leader)
        if link.failing_since is None:
            log.warning("run leader %s does not answer (%s); its runs' findings are paged "
                        "here after %g s", leader, why, self.settings.peer_timeout_seconds)
        link.failed(now, why)
        if self.metrics is not None:
            self.metrics.leader_exchanges.labels(outcome="failed").inc()
