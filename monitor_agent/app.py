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
import sqlite3
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry

from monitor_agent import __version__, limits, wire
from monitor_agent.alerting import Alerting
from monitor_agent.api import actions, alerts, health, ingest, preview, runs
from monitor_agent.engine import Engine
from monitor_agent.exposition import Exposition
from monitor_agent.metrics import SelfMetrics
from monitor_agent.notify.redact import SecretRedactor
from monitor_agent.runner import EngineRunner
from monitor_agent.settings import Settings
from monitor_agent.store import StorageError, Store
from monitor_agent.ui import routes as ui
from monitor_agent.ui.indexer import HistoryIndexer

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
    for module in (ingest, preview, runs, actions, alerts, health):
        app.include_router(module.router)
    app.include_router(ui.api)
    app.include_router(ui.pages)
    app.middleware("http")(storage_gate)
    app.exception_handler(RequestValidationError)(_invalid_request)
    ingest.install_openapi(app)
    return app


async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """422 naming each field, without echoing the input: it may be NaN (not JSON) or hold
    a lone surrogate, and FastAPI's default answer then fails with a 500."""
    detail = [{"loc": [limits.safe(str(p)) for p in err.get("loc", ())],
               "msg": limits.safe(str(err.get("msg", "")), 500), "type": err.get("type")}
              for err in exc.errors()[:20]]
    return Response(wire.dumps({"detail": detail}), status_code=422,
                    media_type="application/json")


def _secrets(settings: Settings) -> list[str | None]:
    a = settings.alerting
    try:
        token = settings.token_value()
    except OSError:
        token = None
    return [token, a.slack.secret(), a.webhook.secret(), a.pagerduty.secret(),
            *[u for u in a.alertmanager.urls if "@" in u]]


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # First: from here on no log line of this process carries a configured secret.
    redactor = SecretRedactor(_secrets(app.state.settings))
    redactor.install()
    try:
        async with _serving(app):
            yield
    finally:
        redactor.uninstall()


@contextlib.asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[None]:
    app.state.registry = registry = CollectorRegistry()
    app.state.metrics = metrics = SelfMetrics(registry, __version__)
    app.state.runner = runner = EngineRunner()
    app.state.readiness = Readiness(metrics)
    try:
        await _open(app)
        worker = asyncio.create_task(_tick_forever(app))
    except STORAGE_ERRORS as exc:
        # A read-only or broken data directory: serve /readyz (503, with the reason) and
        # answer 503 elsewhere, so clients keep spooling, until the storage can be opened.
        _not_ready(app, exc)
        worker = asyncio.create_task(_open_when_possible(app))
    try:
        yield
    finally:
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
        if hasattr(app.state, "history"):
            app.state.history.stop()
        if hasattr(app.state, "engine"):
            app.state.alerting.stop(timeout=5.0)
            await runner.call(_shutdown, app.state.engine, app.state.engine.store)
        runner.close()


STORAGE_ERRORS = (StorageError, sqlite3.Error, OSError)


async def _open(app: FastAPI) -> None:
    """Open the databases, recover active runs and start alerting; then the app is ready."""
    settings: Settings = app.state.settings
    runner, metrics, registry = app.state.runner, app.state.metrics, app.state.registry
    store = await runner.call(
        lambda: Store(settings.db_path, max_bytes=settings.max_db_bytes)
    )
    try:
        alerting = await runner.call(
            lambda: Alerting(settings.alerting, settings.alerts_db_path, registry)
        )
    except BaseException:
        store.close()
        raise
    try:  # a full disk: open (reads work), but not ready for writes until space frees
        await runner.call(store.check_writable, write_headroom(settings))
        unwritable = None
    except StorageError as exc:
        unwritable = f"storage: {exc}"
    engine = Engine(settings, store, metrics, alerting)
    recovered = await runner.call(engine.recover, time.time())
    log.info("recovered %d active runs from %s", recovered, settings.db_path)
    app.state.exposition = Exposition(
        lambda: list(engine.runs.values()), registry,
        max_runs=settings.max_runs_exposed, max_layers=settings.max_layers_exposed,
        max_ranks=settings.max_ranks_exposed, alerts=alerting.active_alerts,
        actions=alerting.action_counts,
        on_drop=lambda reason, count: metrics.dropped_series.labels(reason=reason).inc(count),
    )
    app.state.alerting = alerting
    # The charts' own copy of the history, kept up to date from a thread of its own.
    app.state.history = HistoryIndexer(
        settings.db_path, settings.data_dir / "history.sqlite",
        settings.detectors.ema_alpha, settings.detectors.default_warmup_steps)
    app.state.history.start()
    app.state.engine = engine  # last: its presence means "open" to the storage gate
    alerting.start()
    app.state.readiness.set(unwritable)


def _not_ready(app: FastAPI, exc: BaseException) -> None:
    reason = f"storage: cannot open {app.state.settings.data_dir}: {exc}"
    if app.state.readiness.reason != reason:
        log.error("%s; retrying every %ss", reason, app.state.settings.tick_interval_seconds)
    app.state.readiness.set(reason)


async def _open_when_possible(app: FastAPI) -> None:
    while True:
        await asyncio.sleep(app.state.settings.tick_interval_seconds)
        try:
            await _open(app)
        except STORAGE_ERRORS as exc:
            _not_ready(app, exc)
            continue
        log.info("storage at %s is writable again; ready", app.state.settings.data_dir)
        await _tick_forever(app)


async def storage_gate(request: Request, call_next: Any) -> Response:
    """503 for every route but the health checks while the databases are not open."""
    state = request.app.state
    if hasattr(state, "engine") or request.url.path in ("/healthz", "/readyz"):
        return await call_next(request)
    return JSONResponse({"detail": f"not ready: {state.readiness.reason}; retry later"},
                        status_code=503, headers={"Retry-After": "5"})


def write_headroom(settings: Settings) -> int:
    """Free bytes needed to call the store writable again: room for one more request."""
    cap = settings.max_db_bytes // 8 if settings.max_db_bytes else settings.max_body_bytes
    return min(settings.max_body_bytes, cap)


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
                await state.runner.call(state.engine.store.check_writable,
                                        write_headroom(state.settings))
                await state.runner.call(state.alerting.check_writable)
                state.readiness.set(None)
        except StorageError as exc:
            state.readiness.set(f"storage: {exc}")
        except sqlite3.Error as exc:  # alerts.sqlite: a page could not be made durable
            state.readiness.set(f"alert storage: {exc}")
        except Exception:
            log.exception("tick failed")
