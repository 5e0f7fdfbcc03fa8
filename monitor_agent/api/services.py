"""``Services``: everything the routes use, built once per app by its lifespan.

serving/app.py builds one ``Services`` at startup (``app.state.services``; the one place the app
state is read is ``api/deps.py``) and sets ``backends`` last, once the databases are open:
until then the storage gate answers 503 for every route but /healthz and /readyz. Handlers
take what they need as typed dependencies (``QueriesDep``, ``AlertingDep``...), never from
``request.app.state``.

The lifespan builds it first, opens the databases, then sets
``services.backends = Backends(engine, queries, alerting, exposition)`` and marks itself
ready (``readiness.set(None)``). Until then, asking for a backend is answered 503::

    >>> registry = CollectorRegistry()
    >>> metrics = SelfMetrics(registry)
    >>> services = Services(Settings(), registry, metrics, EngineRunner(), Readiness(metrics))
    >>> services.open, services.readiness.reason
    (False, 'starting')
    >>> try:
    ...     services.queries
    ... except HTTPException as exc:
    ...     print(exc.status_code, exc.detail)
    503 not ready: starting; retry later
    >>> services.runner.close()
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from fastapi import HTTPException
from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting
from monitor_agent.api.backends import Backends
from monitor_agent.api.readiness import Readiness
from monitor_agent.api.rejection_log import RejectionLog
from monitor_agent.api.streamed_page import ReadSlots
from monitor_agent.api.token_health import TokenHealth
from monitor_agent.cluster.drain import NodeDrain
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.reads.exposition import Exposition
from monitor_agent.reads.queries import RunQueries
from monitor_agent.settings import Settings


@dataclass(slots=True)
class Services:
    """The app's parts; ``backends`` is None until storage opened (then set, once)."""

    settings: Settings
    registry: CollectorRegistry
    metrics: SelfMetrics
    runner: EngineRunner
    readiness: Readiness
    rejections: RejectionLog = field(default_factory=RejectionLog)
    token_health: TokenHealth = field(default_factory=TokenHealth)
    backends: Backends | None = None
    # This sidecar's id (cluster/identity.py): named in every peer exchange.
    sidecar: str = ""
    # This node's drain (cluster/drain.py): set with the backends, read by GET /v1/node.
    node_drain: NodeDrain | None = None
    read_slots: ReadSlots = field(init=False)
    """Large read answers in progress (api/streamed_page.py): at most max_read_streams."""

    def __post_init__(self) -> None:
        self.read_slots = ReadSlots(self.settings.max_read_streams)

    @property
    def open(self) -> bool:
        return self.backends is not None

    def _backends(self) -> Backends:
        if self.backends is None:  # the storage gate answers first; this keeps types honest
            raise HTTPException(503, f"not ready: {self.readiness.why_not}; retry later",
                                headers={"Retry-After": "5"})
        return self.backends

    @property
    def engine(self) -> Engine:
        return self._backends().engine

    @property
    def queries(self) -> RunQueries:
        return self._backends().queries

    @property
    def alerting(self) -> Alerting:
        return self._backends().alerting

    @property
    def exposition(self) -> Exposition:
        return self._backends().exposition

    @property
    def history_db(self) -> Path:
        """The charts' copy of the history (history/indexer.py keeps it current)."""
        return self.settings.data_dir / "history.sqlite"
