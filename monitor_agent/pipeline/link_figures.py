"""Every node's TCP figures folded into the runs this sidecar leads (runs/network_slow.py
judges them): a node sidecar's, as its exchange brings them (api/peer.py), and this
sidecar's own host's (the app's probe, cluster/tcp_probe.py). On the engine thread."""

from __future__ import annotations

import logging
from collections.abc import Sequence

from monitor_agent.cluster.settings import ClusterSettings
from monitor_agent.cluster.tcp_probe import LinkSample, PeerLink
from monitor_agent.pipeline import run_views as views
from monitor_agent.pipeline.batch import PeerBatch
from monitor_agent.pipeline.placement import Placement
from monitor_agent.pipeline.registry import LiveRun, RunRegistry
from monitor_agent.runs.node_verdict import NodeVerdict

log = logging.getLogger(__name__)

HOLD_INTERVALS = 3.0
"""Probe intervals a link stays slow before its node is suspect (twice that: sick), and
after which a node's figures are stale (a window of samples: one is a moment, three a
condition)."""


class LinkFigures:
    """Folds TCP figures into the led runs' node verdicts (module docstring)."""

    def __init__(self, settings: ClusterSettings, registry: RunRegistry,
                 placement: Placement) -> None:
        self.window = HOLD_INTERVALS * settings.tcp_probe_interval_seconds
        self.registry, self.placement = registry, placement
        # This sidecar's own addresses, as its own sample shows them: a node sidecar's
        # figures name the leader's node by them (its ranks' leader_url may be a name).
        self.own: tuple[str, ...] = ()

    def from_peer(self, batch: PeerBatch, deferred: dict[str, str], now: float
                  ) -> list[NodeVerdict]:
        """A node sidecar's figures, for each run its exchange names that was taken; the
        node is the one at the address it connects from."""
        if batch.links is None or batch.address is None:
            return []
        out = []
        for peer in batch.runs:
            live = self.registry.get(peer.run_id)
            if live is not None and peer.run_id not in deferred:
                out += self._fold(live, (batch.address,), batch.links, now)
        return out

    def from_self(self, sample: LinkSample, now: float) -> list[NodeVerdict]:
        """This host's own figures, for every run it leads with ranks of its own here."""
        self.own = sample.local
        out = []
        for live in self.registry:
            run = live.state
            if self.placement.leads(run) and any(not r.remote for r in run.ranks.values()):
                mine = {a for r, a in views.addresses(run).items()
                        if not run.ranks[r].remote}
                out += self._fold(live, (*mine, *sample.local), sample.peers, now)
        return out

    def _fold(self, live: LiveRun, local: Sequence[str], peers: Sequence[PeerLink],
              now: float) -> list[NodeVerdict]:
        run = live.state
        aliases = self._aliases(live)
        mapped = views.link_figures(run, local, peers, aliases)
        log.debug("run %s: TCP figures from %s: %s", run.run_id, local, mapped)
        if mapped is None:
            return []
        node, figures = mapped
        verdict = run.observe_links(node, figures, now, self.window, self.window)
        return [verdict] if verdict is not None else []

    def _aliases(self, live: LiveRun) -> dict[str, str]:
        """This sidecar's own addresses -> its own ranks' node."""
        run = live.state
        hosts = run.hosts()
        mine = {hosts[r] for r, st in run.ranks.items() if not st.remote and r in hosts}
        if len(mine) != 1:
            return {}
        node = mine.pop()
        return {a: node for a in self.own}
