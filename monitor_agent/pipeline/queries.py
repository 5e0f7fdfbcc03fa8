"""The read side: what the API and the UI ask of runs, answered as copies.

Live run state is written by the engine thread only (runner.py); a handler that read it on
the event loop could see a rank half-updated. So every method here is called through
``EngineRunner.call`` (on that thread), and builds the views of ``views.py`` from the
store's rows and the run in memory: what leaves is a copy nothing mutates afterwards.

The API calls each method through ``await runner.call(queries.run_detail, run_id)``;
here, directly::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.metrics.sidecar import SelfMetrics
    >>> from monitor_agent.pipeline.engine import Engine, Incoming
    >>> from monitor_agent.records import schemas
    >>> from monitor_agent.settings import Settings
    >>> engine = Engine(Settings(), Store(":memory:"), SelfMetrics(CollectorRegistry()))
    >>> step = {"kind": "step", "run_id": "gpt-7", "step": 1, "time": 1.0, "loss": 2.5}
    >>> _ = engine.ingest([Incoming(0, *schemas.parse_for_store(step))], now=1.0)
    >>> queries = RunQueries(engine.store, engine.registry)
    >>> [(r.run_id, r.active, r.last_step) for r in queries.run_listings()]
    [('gpt-7', True, 1)]
    >>> queries.run_detail("gpt-7").ranks["0"]["latest"]["loss"]
    2.5
    >>> queries.run_detail("no-such-run") is None
    True
"""

from __future__ import annotations

from collections.abc import Sequence

from monitor_agent.pipeline import views
from monitor_agent.pipeline.registry import RunRegistry
from monitor_agent.pipeline.run_state import RunState
from monitor_agent.records import wire
from monitor_agent.storage.store import Store


class RunQueries:
    """Read-only questions about runs, stored and live (engine thread)."""

    def __init__(self, store: Store, registry: RunRegistry) -> None:
        self.store = store
        self.registry = registry

    def _live(self, run_id: str) -> RunState | None:
        live = self.registry.get(run_id)
        return live.state if live is not None else None

    def exposed_runs(self) -> list[RunState]:
        """The runs /metrics renders. The one query called from another thread (the
        scrape's worker): ``RunRegistry.states`` is atomic under the GIL, and the renderer
        caches each run by its ``version``. Rendering on the engine thread instead would
        hold ingest for the whole render (~100 ms at 100k series, bench/exposition.py)."""
        return self.registry.states()

    def run_listings(self) -> list[views.RunListing]:
        """Every stored run, oldest first (``GET /v1/runs``): its fields from the store
        where the run is not in memory, so leaving memory changes none of them."""
        out = []
        for row in self.store.runs():
            live = self._live(row.run_id)
            out.append(views.listing(
                row, live, row.last_step, sum(self.store.finding_counts(row.run_id).values()),
                max(1, len(self.store.attempts(row.run_id)))))
        return out

    def run_summaries(self) -> list[views.RunSummary]:
        """Every stored run with its progress and worst finding (the runs page)."""
        out = []
        for row in self.store.runs():
            live = self._live(row.run_id)
            last = None
            if live is None:
                body = self.store.last_record(row.run_id, 0, "step")
                last = wire.loads(body).get("step") if body is not None else None
            severities = self.store.finding_severity_counts(row.run_id)
            out.append(views.summary(row, live, severities, last))
        return out

    def run_detail(self, run_id: str) -> views.RunDetail | None:
        """A run's status, ranks and findings (``GET /v1/runs/{id}``); None: no such run."""
        row = self.store.run_row(run_id)
        if row is None:
            return None
        return views.detail(row, self._live(run_id), self.store.finding_counts(run_id),
                            self.store.findings(run_id, limit=20), row.last_step,
                            views.attempt_views(self.store.attempts(run_id)))

    def stored_records(self, run_id: str, since_step: int, limit: int,
                       kinds: Sequence[str], attempt: int | None = None) -> list[bytes] | None:
        """A run's stored record lines, oldest step first: its current history, or what
        ``attempt`` sent; None when the run is unknown."""
        bodies = self.store.records(run_id, since_step, limit, kinds, attempt)
        if not bodies and self.store.run_row(run_id) is None:
            return None
        return bodies

    def stored_findings(self, run_id: str, limit: int, current: bool = False) -> list[bytes]:
        """A run's stored finding lines, newest first (``current``: of its current history)."""
        return self.store.findings(run_id, limit, current)
