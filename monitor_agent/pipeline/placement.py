"""One run, one brain (monitor_agent/cluster): whether this sidecar judges a run or
forwards it to the run's leader, and how many nodes a leader waits for. Set by the run
records of this sidecar's own ranks (``place``), kept when the job re-forms without this
machine (``keep_leading``), read back when a run is restored (``restore``)."""

from __future__ import annotations

import logging

from monitor_agent.cluster.link_state import LinkBook
from monitor_agent.cluster.placement import leader_of
from monitor_agent.cluster.roster import Roster
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.registry import LiveRun
from monitor_agent.records.types import RunRecord
from monitor_agent.runs.run_state import RunState
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

log = logging.getLogger(__name__)


class Placement:
    """Where each run is judged: here, or at the leader this sidecar forwards it to."""

    def __init__(self, settings: Settings, store: Store, links: LinkBook) -> None:
        self.settings = settings
        self.store = store
        self.links = links

    def place(self, live: LiveRun, record: RunRecord, attempt: int) -> None:
        """Whether this sidecar judges the run or forwards it to the run's leader, and how
        many nodes a leader waits for: set by the first run record of this sidecar's own
        ranks in the attempt that owns the run's history, changed only when a later
        attempt settles (a relaunch, whose placement may differ: ``RunRegistry.rebuild``
        replays its run record). A run record of another attempt, a second one of the same
        attempt (another rank, or any process that joined it), or a node sidecar's
        forwarded one never moves it (docs/format.md, "Who may write what")."""
        run = live.state
        if attempt != live.attempts.owner or (run.placed_by == attempt
                                              and not views.leads_from_afar(run)):
            return
        try:
            leader = leader_of(record.cluster, self.settings.cluster, self.settings.port)
        except ValueError as exc:
            log.warning("run %s: %s; judging its ranks here alone", run.run_id, exc)
            leader = None
        cluster = record.cluster
        run.roster = Roster()
        if cluster is not None:
            run.roster.expect(cluster.nodes, cluster.local_world_size)
            run.roster.local = {cluster.node_rank}
        run.leader, run.node = leader, cluster.node_rank if cluster is not None else None
        run.placed_by = attempt
        run.changed()

    def keep_leading(self, live: LiveRun, record: RunRecord) -> None:
        """A run this sidecar led in an earlier attempt (``record``: the run record of its
        own ranks that placed it there, as node 0, following no one) and none of whose
        ranks report here in the attempt that owns the run now: the job re-formed without
        this machine (a restart left it out; torchrun renumbered the others from 0). The
        run stays here, one run with one brain, for node sidecars whose
        ``cluster.leader_url`` names this one (cluster/placement.py): this sidecar leads it
        with no node of its own (``roster.local`` empty), admits every node of the new
        job, node 0 included, and expects as many as the first run record they forward of
        the new attempt says (``expect_forwarded``). Leadership itself is never a
        forwarded record's word: only this sidecar's own ranks' records place it."""
        run, cluster = live.state, record.cluster
        if cluster is None or cluster.nodes <= 1 or cluster.node_rank != 0:
            return
        try:
            if leader_of(cluster, self.settings.cluster, self.settings.port) is not None:
                return
        except ValueError:
            return
        run.roster = Roster(local=set())
        run.roster.expect(cluster.nodes, cluster.local_world_size)
        run.leader, run.node = None, None
        run.placed_by = live.attempts.owner
        run.changed()
        # Restored from a snapshot, the forwarded run records of the attempt may not be
        # replayed: the first rank that stepped in it says how many nodes it has.
        owner = live.attempts.owner
        stepped = sorted(r for a, r in self.store.attempt_ranks(live.run_id) if a == owner)
        for rank in stepped[:1]:
            body = self.store.last_record(live.run_id, rank, "run")
            for forwarded in views.run_records([body] if body is not None else []):
                self.expect_forwarded(live, forwarded, owner)

    def expect_forwarded(self, live: LiveRun, record: RunRecord, attempt: int) -> None:
        """How many nodes a run led from afar (``keep_leading``) has in its attempt: what
        the first run record a node sidecar forwards of that attempt says (its ranks are
        all forwarded; this sidecar has no run record of its own to read it from)."""
        run, cluster = live.state, record.cluster
        if (cluster is None or not views.leads_from_afar(run) or attempt != live.attempts.owner
                or run.roster.attempt == attempt):
            return
        run.roster.expected = max(cluster.nodes, 1)
        if cluster.local_world_size is not None:
            run.roster.local_world_size = cluster.local_world_size
        run.roster.attempt = attempt
        run.changed()

    def restore(self, live: LiveRun, carried_only: bool = False) -> None:
        """Where a run restored from its snapshot sits. The tail replayed after the
        snapshot may no longer hold the run record that placed it, so the first one of
        this sidecar's own ranks in the attempt that owns the run is read back (and the
        run's description, from the latest run record of that attempt). A run whose owner
        attempt has no run record of this sidecar's own ranks may be one it leads from afar
        (``keep_leading``); ``carried_only``: only that is read back (the whole history
        is replayed after, placing the rest)."""
        owner = live.attempts.owner
        ranks = set(live.state.ranks)
        if carried_only:  # nothing restored yet: the ranks the store knows of
            ranks.update(rank for _, rank in self.store.attempt_ranks(live.run_id))
        attempt, found = self.store.placing_records(live.run_id, sorted(ranks), owner)
        if attempt < owner:
            # The owner attempt's settle superseded the earlier attempts' run records: the
            # one that placed the run here before is read from the replaced history.
            led, before = self.store.placing_records(live.run_id, sorted(ranks), owner,
                                                     replaced=True)
            first = views.run_records(before)[:1]
            if first and led < owner and live.state.placed_by is None:
                self.keep_leading(live, first[0])
            if carried_only or views.leads_from_afar(live.state):
                return
        elif carried_only:
            return
        for record in views.run_records(found):
            live.state.apply_run(record)
            self.place(live, record, owner)

    def leads(self, run: RunState) -> bool:
        """Whether this sidecar is the leader of a multi-node run (its ranks are node 0's,
        or it led the run before the job re-formed without its machine)."""
        return (self.settings.cluster.enabled and run.leader is None
                and (run.node == 0 or views.leads_from_afar(run)) and run.roster.expected > 1)

    def following(self, run: RunState) -> str | None:
        """The leader this sidecar forwards the run to, or None when it judges it here."""
        leader = run.leader
        return None if leader is None or self.links.is_self(leader) else leader
