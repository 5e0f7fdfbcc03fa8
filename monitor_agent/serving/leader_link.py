"""The app's wiring of a node sidecar's link to its run leaders (cluster/link.py).

The link thread asks the engine (on the engine's own thread, through the runner, in its
``FIRST`` lane: what the run's leader judges waits on it) what is queued and which runs it
follows, and keeps the leaders' decisions in alerting's database,
where ``GET /v1/runs/{id}/actions`` and the ingest answers serve them to this node's ranks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from monitor_agent.alerting import Alerting
from monitor_agent.alerting.plan_check import action_problem
from monitor_agent.cluster.link import FollowedRun, LeaderLink, OwedItem
from monitor_agent.cluster.tcp_probe import LinkSample, ProbeThread, TcpProbe
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine
from monitor_agent.pipeline.runner import FIRST, EngineRunner
from monitor_agent.records.actions import Action
from monitor_agent.settings import Settings

log = logging.getLogger(__name__)


class EnginePort:
    """``cluster.link.Port`` over the engine (its thread) and alerting (thread-safe)."""

    def __init__(self, runner: EngineRunner, engine: Engine, alerting: Alerting,
                 metrics: SelfMetrics) -> None:
        self.runner, self.engine, self.alerting = runner, engine, alerting
        self.metrics = metrics

    def followed(self) -> list[tuple[str, FollowedRun]]:
        return list(self.runner.submit(self.engine.followed, lane=FIRST))

    def leaders(self) -> list[str]:
        return self.runner.submit(self.engine.store.uplink.leaders, lane=FIRST)

    def batch(self, leader: str, limit: int, skip: list[str]) -> list[OwedItem]:
        return list(self.runner.submit(self.engine.store.uplink.batch, leader, limit, skip,
                                      lane=FIRST))

    def ack(self, ids: list[int]) -> None:
        if ids:
            def ack() -> None:
                queue = self.engine.store.uplink
                queue.ack(ids)
                self.metrics.uplink_queued.set(queue.rows)
            self.runner.submit(ack, lane=FIRST)

    def page_stranded(self, leader: str, now: float, why: str | None,
                      run_id: str | None = None) -> int:
        return self.runner.submit(self.engine.page_stranded, leader, now, why, run_id,
                                  lane=FIRST)

    def known_action(self, run_id: str) -> int:
        found = self.alerting.actions_for_run(run_id, 0, 1000)
        return max((a.id for a in found), default=0)

    def hand_over(self, run_id: str) -> None:
        self.alerting.hand_over(run_id, time.time())

    def adopt(self, run_id: str, actions: list[dict[str, Any]], leader: str) -> None:
        """Keep the leader's actions for this node's ranks: each checked as this sidecar's
        own rules could have decided it about the run as it knows it (alerting/plan_check.py);
        one that is not is dropped, saying why."""
        kept = []
        bounds = self.runner.submit(self.engine.run_bounds, run_id, lane=FIRST)
        for a in actions:
            why = action_problem(a, bounds)
            if why is not None:
                log.warning("run %s: action %s from the leader %s dropped: %s", run_id,
                            str(a.get("id"))[:20], leader, why)
                continue
            try:
                # Withdrawals travel as actions of their own (AlertStore.adopt).
                kept.append(replace(Action.parse(a, run_id), withdrawn_by=None))
            except (KeyError, TypeError, ValueError):
                continue
        fresh = self.alerting.adopt_actions(run_id, kept, leader) if kept else []
        if fresh:  # the run now awaits its resume, or is stopping (runs/lifecycle.py)
            self.runner.submit(self.engine.acted, run_id, fresh, time.time())


def leader_link(settings: Settings, runner: EngineRunner, engine: Engine, alerting: Alerting,
                metrics: SelfMetrics, sidecar: str, probe: ProbeThread | None = None
                ) -> LeaderLink:
    """The link thread (not started) of this sidecar; it sends ``probe``'s samples."""
    port = EnginePort(runner, engine, alerting, metrics)
    return LeaderLink(settings.cluster, engine.links, sidecar, port, settings.peer_token_value,
                      metrics, links=(lambda: probe.latest) if probe is not None else None)


def tcp_probe(settings: Settings, runner: EngineRunner, engine: Engine) -> ProbeThread | None:
    """This host's TCP probe (cluster/tcp_probe.py; not started): each sample judged here
    for the runs this sidecar leads (``Engine.own_links``) and sent to the leaders it
    follows. None when ``cluster.tcp_probe`` (or the cluster) is off. The sidecars' own
    port (and the leader's) is left out: the link's traffic is not the job's."""
    cluster = settings.cluster
    if not (cluster.enabled and cluster.tcp_probe):
        return None
    skip = {settings.port}
    if cluster.leader_url is not None:
        parts = urlsplit(cluster.leader_url)
        skip.add(parts.port or (443 if parts.scheme == "https" else 80))
    interval = cluster.tcp_probe_interval_seconds
    probe = TcpProbe(active_ms=int(interval * 1000), skip_ports=frozenset(skip))

    def judge(sample: LinkSample) -> None:
        runner.submit_nowait(engine.own_links, sample, time.time())

    return ProbeThread(probe, interval, judge)
