"""The app's wiring of a node sidecar's link to its run leaders (cluster/link.py).

The link thread asks the engine (on the engine's own thread, through the runner) what is
queued and which runs it follows, and keeps the leaders' decisions in alerting's database,
where ``GET /v1/runs/{id}/actions`` and the ingest answers serve them to this node's ranks.
"""

from __future__ import annotations

import time
from typing import Any

from monitor_agent.alerting import Alerting
from monitor_agent.alerting.alerts import Action
from monitor_agent.cluster.link import FollowedRun, LeaderLink, OwedItem
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.settings import Settings


class EnginePort:
    """``cluster.link.Port`` over the engine (its thread) and alerting (thread-safe)."""

    def __init__(self, runner: EngineRunner, engine: Engine, alerting: Alerting,
                 metrics: SelfMetrics, max_rows: int) -> None:
        self.runner, self.engine, self.alerting = runner, engine, alerting
        self.metrics, self.max_rows = metrics, max_rows

    def followed(self) -> list[tuple[str, FollowedRun]]:
        return list(self.runner.submit(self.engine.followed))

    def leaders(self) -> list[str]:
        return self.runner.submit(self.engine.store.uplink.leaders)

    def batch(self, leader: str, limit: int) -> list[OwedItem]:
        def read() -> list[OwedItem]:
            queue = self.engine.store.uplink
            dropped = queue.trim(leader, self.max_rows)
            if dropped:
                self.metrics.uplink_dropped.inc(dropped)
            self.metrics.uplink_queued.set(sum(queue.depth(x) for x in queue.leaders()))
            return list(queue.batch(leader, limit))
        return self.runner.submit(read)

    def ack(self, ids: list[int]) -> None:
        if ids:
            self.runner.submit(self.engine.store.uplink.ack, ids)

    def page_stranded(self, leader: str, now: float, why: str | None) -> int:
        return self.runner.submit(self.engine.page_stranded, leader, now, why)

    def known_action(self, run_id: str) -> int:
        found = self.alerting.actions_for_run(run_id, 0, 1000)
        return max((a.id for a in found), default=0)

    def hand_over(self, run_id: str) -> None:
        self.alerting.hand_over(run_id, time.time())

    def adopt(self, run_id: str, actions: list[dict[str, Any]], leader: str) -> None:
        kept = []
        for a in actions:
            try:
                kept.append(Action(
                    id=int(a["id"]), run_id=run_id, action=str(a["action"]),
                    rule=str(a.get("rule") or ""), type=str(a.get("type") or ""),
                    step=int(a.get("step") or 0), message=str(a.get("message") or ""),
                    created_at=float(a.get("created_at") or 0.0),
                    honoured_step=None if a.get("honoured_step") is None
                    else int(a["honoured_step"]),
                    plan=a.get("plan") if isinstance(a.get("plan"), dict) else None))
            except (KeyError, TypeError, ValueError):
                continue
        fresh = self.alerting.adopt_actions(run_id, kept, leader) if kept else []
        if fresh:  # the run now awaits its resume, or is stopping (runs/lifecycle.py)
            self.runner.submit(self.engine.acted, run_id, [a.to_dict() for a in fresh],
                               time.time())


def leader_link(settings: Settings, runner: EngineRunner, engine: Engine, alerting: Alerting,
                metrics: SelfMetrics, sidecar: str) -> LeaderLink:
    """The link thread (not started) of this sidecar."""
    port = EnginePort(runner, engine, alerting, metrics, settings.cluster.uplink_max_rows)
    return LeaderLink(settings.cluster, engine.links, sidecar, port, settings.token_value,
                      metrics)
