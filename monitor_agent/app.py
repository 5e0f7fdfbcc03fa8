"""``create_app(settings)``: the FastAPI app, with everything it owns built in its lifespan.

No module-level state: two apps with two settings objects can live in one process (tests
do exactly that).

Example::

    app = create_app(load_settings(port=9400, data_dir=Path("/tmp/m")))
    uvicorn.run(app, host="127.0.0.1", port=9400)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from monitor_agent import __version__
from monitor_agent.alerting import Alerting
from monitor_agent.api import alerts, health, ingest, runs
from monitor_agent.engine import Engine
from monitor_agent.exposition import Exposition
from monitor_agent.metrics import SelfMetrics
from monitor_agent.runner import EngineRunner
from monitor_agent.settings import Settings
from monitor_agent.store import StorageError, Store

log = logging.getLogger(__name__)


class Readiness:
    """Whether the sidecar can store records now, and why not."""

    def __init__(self, metrics: SelfMetrics) -> None:
        self._metrics = metrics
        self.reason: str | None = "starting"

    @property
    def ready(self) -> bool:
        return self.reason is None

    def set(self, reason: str | None) -> None:
        self.reason = reason
        self._metrics.ready.set(1 if reason is None else 0)


def create_app(settings: Settings) -> FastAPI:
    """Build the sidecar app; resources are opened on startup and closed on shutdown."""
    app = FastAPI(
        title="monitor-agent",
        version=__version__,
        summary="Training-run health monitor: ingest, detect, alert, expose.",
        lifespan=_lifespan,
    )
    app.state.settings = settings
    for module in (ingest, runs, alerts, health):
        app.include_router(module.router)
    ingest.install_openapi(app)
    return app


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings: Settings = app.state.settings
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry, __version__)
    runner = EngineRunner()
    store = await runner.call(
        lambda: Store(settings.db_path, max_bytes=settings.max_db_bytes)
    )
    alerting = await runner.call(
        lambda: Alerting(settings.alerting, settings.alerts_db_path, registry)
    )
    engine = Engine(settings, store, metrics, alerting)
    readiness = Readiness(metrics)
    recovered = await runner.call(engine.recover, time.time())
    log.info("recovered %d active runs from %s", recovered, settings.db_path)
    parts = dict(
        engine=engine, runner=runner, metrics=metrics, registry=registry, alerting=alerting,
        readiness=readiness,
        exposition=Exposition(
            lambda: list(engine.runs.values()), registry,
            max_runs=settings.max_runs_exposed, max_layers=settings.max_layers_exposed,
            max_ranks=settings.max_ranks_exposed, alerts=alerting.active_alerts,
            on_drop=lambda reason, count: metrics.dropped_series.labels(reason=reason).inc(count),
        ),
    )
    for name, value in parts.items():
        setattr(app.state, name, value)
    alerting.start()
    readiness.set(None)
    ticker = asyncio.create_task(_tick_forever(app))
    try:
        yield
    finally:
        ticker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await ticker
        alerting.stop(timeout=5.0)
        await runner.call(_shutdown, engine, store)
        runner.close()


def _shutdown(engine: Engine, store: Store) -> None:
    try:
        engine.snapshot_all()
    except StorageError:
        log.warning("could not save detector state at shutdown; the tail replays on restart")
    store.close()


async def _tick_forever(app: FastAPI) -> None:
    state = app.state
    while True:
        await asyncio.sleep(state.settings.tick_interval_seconds)
        try:
            await state.runner.call(state.engine.tick, time.time())
            if not state.readiness.ready:
                await state.runner.call(state.engine.store.check_writable)
                state.readiness.set(None)
        except StorageError as exc:
            state.readiness.set(f"storage: {exc}")
        except Exception:
            log.exception("tick failed")
