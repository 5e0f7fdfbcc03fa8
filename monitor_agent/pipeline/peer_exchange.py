"""The leader's side of one run, one brain (monitor_agent/cluster): a node sidecar's
exchange taken (``exchange``: its digests through the engine's ingest, its findings paged
here for the whole run, its heartbeat kept), and the node sidecar's side of what it owes
its leaders: the runs it follows (``followed``) and the findings nobody paged
(``page_stranded``). Placement itself (who leads) is pipeline/placement.py."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from monitor_agent.detectors.support.context import host_label
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.batch import Incoming, IngestResult, PeerBatch, PeerRun
from monitor_agent.pipeline.batch_end import BatchEnd
from monitor_agent.pipeline.consequences import Consequences
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.pipeline.routing import Router
from monitor_agent.records.types import Finding
from monitor_agent.storage.store import Store
from monitor_agent.storage.uplink import CLOSED, LOCAL_VIEW, PAGED

Ingest = Callable[[Sequence[Incoming], float], IngestResult]
"""The engine's ingest (``Engine.ingest``): a node sidecar's digests go through it."""


class PeerExchange:
    """The exchanges between a run's leader and its node sidecars, on the engine thread."""

    def __init__(self, store: Store, registry: RunRegistry, placement: Placement,
                 router: Router, consequences: Consequences, batch_end: BatchEnd,
                 ingest: Ingest) -> None:
        self.store = store
        self.consequences = consequences
        self.registry = registry
        self.placement = placement
        self.router = router
        self.batch_end = batch_end
        self._ingest = ingest

    def exchange(self, batch: PeerBatch, now: float) -> IngestResult:
        """A node sidecar's exchange with this one, the leader of its runs: its digests go
        through ``ingest`` (the same checks as a client's records; judged by the
        cross-rank detectors only), its findings are paged here for the whole run, and its
        heartbeat keeps its node in the runs' view. Only runs this sidecar leads, from a
        node of the run's placement (``refusal``), are taken: the rest of the
        exchange is left with the node sidecar (``deferred``) to send again.

        Findings the node paged itself while this leader was away go first: they are about
        what the digests behind them say, so this leader's own judgement of those digests
        joins the alert they began instead of paging it again.

        Raises as ``ingest`` does; a finding's effects are committed before the answer."""
        deferred, nodes = self._runs_taken(batch, now)
        items, refused = self._items_taken(batch, deferred, nodes)
        carried = {(item.record.run_id, item.record.rank) for item in items}
        findings, refused_findings = [], []
        for index, (f, flags) in enumerate(batch.findings):
            if f.run_id in deferred:
                continue
            why = self._finding_refusal(f, nodes[f.run_id], batch.forwarder, carried)
            if why is None:
                findings.append((f, flags))
            else:
                refused_findings.append({"index": index, "reason": why})
        told = [(f, flags) for f, flags in findings if flags & PAGED]
        found = self._findings(told, now)
        result = self._ingest(items, now) if items else IngestResult()
        result.rejected.extend(refused)
        result.rejected_findings.extend(refused_findings)
        self._heard(batch, items, result, deferred, nodes, now)
        later = self._findings([(f, flags) for f, flags in findings
                                if not flags & PAGED], now)
        result.actions.extend(found.actions + later.actions)
        result.deferred, result.taken = deferred, len(findings)
        return result

    def _runs_taken(self, batch: PeerBatch, now: float) -> tuple[dict[str, str],
                                                                 dict[str, int]]:
        """The runs of the exchange left with the node sidecar, and why (``deferred``);
        the node each run's items come from."""
        deferred: dict[str, str] = {}
        nodes: dict[str, int] = {}
        for peer in batch.runs:
            peer = self._known_node(peer, batch.sidecar)
            why = self.refusal(peer, now)
            if why is not None:
                deferred[peer.run_id] = why
            nodes[peer.run_id] = peer.node
        for run_id, why in self._relaunched_here(batch).items():
            deferred.setdefault(run_id, why)
        return deferred, nodes

    def _items_taken(self, batch: PeerBatch, deferred: dict[str, str], nodes: dict[str, int]
                     ) -> tuple[list[Incoming], list[dict[str, Any]]]:
        """The digests of runs taken, each marked with its node, and those refused: a
        digest of a rank that reports to this sidecar itself."""
        items, refused = [], []
        for item in batch.items:
            if item.record.run_id in deferred:
                continue
            item = dataclasses.replace(item, origin=nodes[item.record.run_id])
            live = self.registry.get(item.record.run_id)
            rank = live.state.ranks.get(item.record.rank) if live is not None else None
            if (rank is not None and live is not None and not rank.remote
                    and not views.leads_from_afar(live.state)):
                refused.append({"index": item.index, "reason": (
                    f"rank: rank {item.record.rank} of run {item.record.run_id} reports to "
                    "this sidecar itself: a node sidecar forwards only its own ranks")})
                continue
            items.append(item)
        return items, refused

    def _heard(self, batch: PeerBatch, items: list[Incoming], result: IngestResult,
               deferred: dict[str, str], nodes: dict[str, int], now: float) -> None:
        """What the exchange says of who forwards each rank taken (``RankState.via``) and
        of the node sidecar's heartbeat (the run's roster)."""
        taken = {r["index"] for r in result.rejected}
        for item in items:
            if item.index not in taken:
                live = self.registry.get(item.record.run_id)
                if live is not None:
                    live.state.rank(item.record.rank).via = batch.forwarder
        for peer in batch.runs:
            live = self.registry.get(peer.run_id)
            if live is not None and peer.run_id not in deferred:
                live.state.roster.heard(nodes[peer.run_id], batch.sidecar, peer.host,
                                        list(peer.ranks), now)

    def _relaunched_here(self, batch: PeerBatch) -> dict[str, str]:
        """Runs whose exchange waits (``deferred``): a record of one of this sidecar's own
        ranks under a token the run has not placed, a new process of that rank number on
        another machine (a re-formed job renumbered the ranks, and this sidecar has not
        settled the new attempt from the others' records yet). Refused outright it would
        be lost; once the run leads from afar (``Placement.keep_leading``) it is taken. What a
        node sidecar may say of this sidecar's own ranks is unchanged: nothing."""
        out: dict[str, str] = {}
        for item in batch.items:
            record = item.record
            live = self.registry.get(record.run_id)
            rank = live.state.ranks.get(record.rank) if live is not None else None
            if (live is None or rank is None or rank.remote or views.leads_from_afar(live.state)
                    or (record.attempt or "") in live.attempts.tokens):
                continue
            out.setdefault(record.run_id, (
                f"run {record.run_id}: rank {record.rank} reports to this sidecar itself; "
                "a new process of it elsewhere waits for the run's next attempt here"))
        return out

    def _finding_refusal(self, finding: Finding, node: int, forwarder: str,
                              carried: set[tuple[str, int]]) -> str | None:
        """Why a node sidecar's finding may not be taken here, or None. A finding acts on
        the run (its rules may roll back, stop, restart), so it is taken only about a
        rank whose records that very node sidecar forwards: a rank it forwarded before
        (``RankState.via``: its id at the address it connects from), or one whose records
        ride this exchange and pass the checks of ``/v1/records`` with it. A caller that
        holds the link's credential but not the rank's records (the credential is derived
        from the write token unless ``cluster.peer_token`` is set) cannot make the leader
        act on another node's rank, nor on this sidecar's own."""
        live = self.registry.get(finding.run_id)
        rank = live.state.ranks.get(finding.rank) if live is not None else None
        where = f"rank {finding.rank} of run {finding.run_id}"
        if rank is not None and not rank.remote and not (
                live is not None and views.leads_from_afar(live.state)):
            return f"rank: {where} reports to this sidecar itself, not through node {node}"
        if rank is not None and rank.via is not None and rank.via != forwarder:
            return (f"rank: {where} is forwarded by another node sidecar ({rank.via}); a "
                    "finding is taken only from the sidecar that forwards the rank's records")
        if (rank is None or rank.via is None) and (finding.run_id, finding.rank) not in carried:
            return (f"rank: no record of {where} reached this leader from node {node}; a "
                    "finding is taken only about a rank whose records its sidecar forwards")
        return None

    def _known_node(self, peer: PeerRun, sidecar: str) -> PeerRun:
        """A run a node sidecar owes items of but no longer holds in memory comes as node
        -1: the node that sidecar was heard as for the run, if this leader heard it."""
        live = self.registry.get(peer.run_id)
        if peer.node >= 0 or live is None:
            return peer
        node = next((n for n, seen in live.state.roster.nodes.items()
                     if seen.sidecar == sidecar), -1)
        return dataclasses.replace(peer, node=node)

    def refusal(self, peer: PeerRun, now: float) -> str | None:
        """Why a node sidecar's items of ``peer``'s run are not taken here (now), or None:
        this sidecar does not lead the run (its own node 0 ranks have not placed it here,
        or placed it elsewhere), or the node is not one of the run's placement."""
        live = self.registry.get(peer.run_id)
        if live is None and self.store.run_row(peer.run_id) is not None:
            live = self.registry.admit(peer.run_id, now)
        if live is None:
            return (f"run {peer.run_id}: no rank of it reported to this sidecar (the leader "
                    "is node 0's sidecar, placed by node 0's ranks)")
        run = live.state
        if not self.placement.leads(run):
            return f"run {peer.run_id}: this sidecar does not lead it (its ranks here " + (
                f"are node {run.node}'s)" if run.node is not None else "name no node)")
        first = 0 if views.leads_from_afar(run) else 1
        if not first <= peer.node < run.roster.expected:
            return (f"run {peer.run_id}: node {peer.node} is not a node of its placement "
                    f"(nodes {first}..{run.roster.expected - 1} follow this leader)")
        return None

    def _findings(self, items: list[tuple[Finding, int]], now: float) -> IngestResult:
        """Take a node sidecar's findings (those ``_finding_refusal`` let in), run by run,
        and store what they found; a run whose effects could not be stored leaves memory
        (judged again from the store, as ``Engine.ingest`` does)."""
        by_run: dict[str, list[tuple[Finding, int]]] = {}
        for finding, flags in items:
            by_run.setdefault(finding.run_id, []).append((finding, flags))
        found = IngestResult()
        with self.registry.evicted_on_failure(by_run, "a node sidecar's findings not stored"):
            for run_id, found_here in by_run.items():
                live = self.registry.get(run_id)  # led here: ingest_peer loaded it
                if live is not None:
                    self._remote_findings(live, found_here, now, found)
            if found.findings:
                self.store.insert_findings([f.to_dict() for f in found.findings])
        return found

    def _remote_findings(self, live: LiveRun, items: list[tuple[Finding, int]], now: float,
                         result: IngestResult) -> None:
        """A node sidecar's findings about its own ranks: the run's, counted once here.
        A cross-rank one made from that node's view alone is left out (this sidecar
        judges those from every node's digests) unless the node paged it while this one
        was away: then it is recorded as told, so the same fault is not paged twice.
        ``fresh``: not paged by the node (paged here); ``told``: paged there while this
        leader was away (recorded, not paged again); ``closed``: paged and resolved there
        (the run completed meanwhile: recorded as resolved)."""
        run = live.state
        attempt = max(live.attempts.current, 1)
        fresh: list[Finding] = []
        told: list[Finding] = []
        closed: list[Finding] = []
        for finding, flags in items:
            if flags & LOCAL_VIEW and not flags & PAGED:
                continue
            f = dataclasses.replace(finding, attempt=attempt)
            if run.ledger.observe(f):
                run.changed()
            (closed if flags & CLOSED else told if flags & PAGED else fresh).append(f)
        if run.verdict.observe(None, fresh + told + closed):
            self.consequences.store_verdict(run)
        if told:
            self.router.handle(run, told, now, result, told=True)
        if closed:
            self.router.handle(run, closed, now, result, told=True, closed=True)
        if fresh:
            self.router.handle(run, fresh, now, result)

    def followed(self) -> list[tuple[str, PeerRun]]:
        """The runs this sidecar follows: (leader, run) for every run in memory this sidecar forwards to a leader: what
        its heartbeat names (cluster/link.py asks, on the engine thread)."""
        out = []
        for live in self.registry:
            run = live.state
            leader = self.placement.following(run)
            if leader is not None and run.node is not None and run.left_out is None:
                host = host_label(run.run.labels) if run.run is not None else None
                out.append((leader, PeerRun(run.run_id, run.node, host,
                                            tuple(sorted(run.ranks)))))
        return out

    def page_stranded(self, leader: str, now: float, why: str | None,
                      run_id: str | None = None) -> int:
        """Page the stranded findings: page here what is owed to ``leader`` (of ``run_id``, or every run) and nobody
        paged: it has been away too long, or will not take the run (``why``, said in each
        page as a partial view), or it turned out to be this very sidecar (``why`` None:
        the run was never followed). Returns how many."""
        queued = self.store.uplink.stranded(leader, run_id)
        paged = self.batch_end.page_owed(queued, now, why)
        self.store.uplink.mark_paged([q.id for q in queued])
        return paged
