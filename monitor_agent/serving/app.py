"""``create_app(settings)``: the FastAPI app, with everything it owns built in its lifespan.

No module-level state: two apps with two settings objects can live in one process (tests
do exactly that). The lifespan builds one ``Services`` (api/services.py) and sets its
``backends`` once the databases are open; routes get its parts as typed dependencies
(api/deps.py). What the lifespan starts it stops in reverse order on shutdown.

Building the app opens nothing; serving it does: ``monitor-agent serve`` (cli.py) runs it
under uvicorn with ``serving/server.py``'s ``uvicorn_config``, and the tests through
``serving/embedded.py``'s ``EmbeddedServer``. The routes it documents, unserved::

    >>> app = create_app(Settings())
    >>> sorted(app.openapi()["paths"])
    ['/healthz', '/metrics', '/readyz', '/v1/alerts', '/v1/alerts/{fingerprint}/ack',
     '/v1/node', '/v1/node/drain', '/v1/peer/digests', '/v1/records', '/v1/records/preview', '/v1/runs', '/v1/runs/{run_id}',
     '/v1/runs/{run_id}/actions', '/v1/runs/{run_id}/checkpoints', '/v1/runs/{run_id}/findings',
     '/v1/runs/{run_id}/goodput', '/v1/runs/{run_id}/matrix/{stat}', '/v1/runs/{run_id}/nodes',
     '/v1/runs/{run_id}/records',
     '/v1/runs/{run_id}/series', '/v1/silences', '/v1/silences/{id}', '/v1/ui/runs']
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from prometheus_client import CollectorRegistry
from starlette.types import ASGIApp, Receive, Scope, Send

from monitor_agent import __version__
from monitor_agent.alerting import Alerting
from monitor_agent.api import (
    actions,
    alerts,
    charts,
    checkpoints,
    goodput,
    health,
    ingest,
    node,
    node_verdicts,
    peer,
    preview,
    runs,
    runs_page,
)
from monitor_agent.api.backends import Backends
from monitor_agent.api.deps import services
from monitor_agent.api.openapi import install_openapi
from monitor_agent.api.readiness import Readiness
from monitor_agent.api.services import Services
from monitor_agent.cluster.drain import NodeDrain
from monitor_agent.cluster.identity import sidecar_id
from monitor_agent.history.indexer import HistoryIndexer
from monitor_agent.history.schema import HISTORY_SOURCE
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.notify.redact import SecretRedactor
from monitor_agent.pipeline.engine import Engine
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.reads.exposition import Exposition
from monitor_agent.reads.queries import RunQueries
from monitor_agent.records import limits, wire
from monitor_agent.serving.browser_guard import BrowserGuard, fastapi_docs_pages
from monitor_agent.serving.leader_link import leader_link, tcp_probe
from monitor_agent.settings import Settings, TokenError
from monitor_agent.storage.data_lock import DataDirLock
from monitor_agent.storage.database import StorageError
from monitor_agent.storage.store import Store
from monitor_agent.ui import pages

log = logging.getLogger(__name__)


def create_app(settings: Settings) -> FastAPI:
    """Build the sidecar app; resources are opened on startup and closed on shutdown."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with _lifespan(app, settings):
            yield

    app = FastAPI(
        title="monitor-agent",
        version=__version__,
        summary="Training-run health monitor: ingest, detect, alert, expose.",
        lifespan=lifespan,
    )
    for module in (ingest, preview, runs, actions, checkpoints, goodput, node_verdicts, alerts,
                   health, peer, node, charts, runs_page, pages):
        app.include_router(module.router)
    app.add_middleware(StorageGate)
    # Added last, so outermost: its headers reach every answer, the gate's 503 included.
    app.add_middleware(BrowserGuard, allowed_hosts=settings.allowed_hosts,
                       docs=fastapi_docs_pages(app))
    app.exception_handler(RequestValidationError)(_invalid_request)
    app.exception_handler(StorageError)(_storage_failed)
    install_openapi(app)
    return app


async def _invalid_request(request: Request, exc: RequestValidationError) -> Response:
    """422 naming each field, without echoing the input: it may be NaN (not JSON) or hold
    a lone surrogate, and FastAPI's default answer then fails with a 500."""
    detail = [{"loc": [limits.safe(str(p)) for p in err.get("loc", ())],
               "msg": limits.safe(str(err.get("msg", "")), 500), "type": err.get("type")}
              for err in exc.errors()[:20]]
    return Response(wire.dumps({"detail": detail}), status_code=422,
                    media_type="application/json")


async def _storage_failed(request: Request, exc: Exception) -> Response:
    """A read that met a storage failure: 503 with the reason, never a bare 500, and the
    failure told to readiness (a corrupt database turns /readyz and ingest red, or is
    repaired when it is derived data)."""
    assert isinstance(exc, StorageError)
    services(request).readiness.failed(exc)
    what = "is corrupt" if exc.corrupt else "failed"
    repairing = "; it is being rebuilt from the records" if (
        exc.corrupt and exc.source in services(request).readiness.repairs) else ""
    return JSONResponse({"detail": f"{exc.source} {what}: {limits.safe(str(exc), 300)}"
                                   f"{repairing}; retry later"},
                        status_code=503, headers={"Retry-After": "5"})


def _secrets(settings: Settings) -> list[str | None]:
    a = settings.alerting
    try:
        token, peer = settings.token_value(), settings.peer_token_value()
    except TokenError:  # refused when the settings were built; gone since: nothing to mask
        token = peer = None
    return [token, peer, a.slack.secret(), a.webhook.secret(), a.pagerduty.secret(),
            *[u for u in a.alertmanager.urls if "@" in u]]


@contextlib.asynccontextmanager
async def _lifespan(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    # First: from here on no log line of this process carries a configured secret.
    redactor = SecretRedactor(_secrets(settings))
    redactor.install()
    try:
        async with _serving(app, settings):
            yield
    finally:
        redactor.uninstall()


@contextlib.asynccontextmanager
async def _serving(app: FastAPI, settings: Settings) -> AsyncIterator[None]:
    registry = CollectorRegistry()
    metrics = SelfMetrics(registry, __version__)
    services = Services(settings, registry, metrics, EngineRunner(), Readiness(metrics))
    app.state.services = services  # the one attribute; api/deps.py reads it, typed
    # Before anything opens a database: a second sidecar on this directory stops here.
    lock = DataDirLock(settings.data_dir).acquire()
    try:
        # What _open starts, stopped in reverse: the charts' indexer, alerting, the engine.
        async with contextlib.AsyncExitStack() as opened:
            try:
                await _open(services, opened)
                worker = asyncio.create_task(_tick_forever(services))
            except STORAGE_ERRORS as exc:
                # A read-only or broken data directory: serve /readyz (503, with the
                # reason) and 503 elsewhere, so clients keep spooling, until it opens.
                _not_ready(services, exc)
                worker = asyncio.create_task(_open_when_possible(services, opened))
            try:
                yield
            finally:
                worker.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await worker
    finally:
        services.runner.close()
        lock.release()


# OSError: what SQLite does not report, e.g. the data directory's free space unreadable.
STORAGE_ERRORS = (StorageError, OSError)


async def _open(services: Services, opened: contextlib.AsyncExitStack) -> None:
    """Open the databases, recover active runs and start alerting; then the app is ready."""
    settings, runner = services.settings, services.runner
    metrics, registry = services.metrics, services.registry
    store = await runner.call(
        lambda: Store(settings.db_path, max_bytes=settings.max_db_bytes)
    )
    try:
        await runner.call(store.check_integrity)
        alerting = await runner.call(
            lambda: Alerting(settings.alerting, settings.alerts_db_path, registry)
        )
    except BaseException:
        store.close()
        raise
    try:
        await runner.call(alerting.db.check_integrity)
    except BaseException:
        alerting.db.close()
        store.close()
        raise
    try:  # a full disk: open (reads work), but not ready for writes until space frees
        await runner.call(store.check_writable, write_headroom(settings))
        unwritable = None
    except StorageError as exc:
        unwritable = f"storage: {exc}"
    engine = Engine(settings, store, metrics, alerting)
    services.sidecar = await runner.call(sidecar_id, settings.data_dir)
    engine.identity = services.sidecar
    engine.node_drain = services.node_drain = NodeDrain(
        settings.cluster.drain, settings.data_dir,
        on_change=lambda drained: metrics.node_drained.set(1 if drained else 0))
    recovered = await runner.call(engine.recover, time.time())
    log.info("recovered %d active runs from %s", recovered, settings.db_path)
    queries = RunQueries(store, engine.registry)
    exposition = Exposition(
        queries.exposed_runs, registry,
        max_runs=settings.max_runs_exposed, max_layers=settings.max_layers_exposed,
        max_ranks=settings.max_ranks_exposed, alerts=alerting.active_alerts,
        actions=alerting.action_counts,
        on_drop=lambda reason, count: metrics.dropped_series.labels(reason=reason).inc(count),
        on_error=metrics.background_errors.labels(part="exposition").inc,
    )
    # The charts' own copy of the history, kept up to date from a thread of its own.
    history = HistoryIndexer(
        settings.db_path, services.history_db,
        settings.detectors.ema_alpha, settings.detectors.default_warmup_steps,
        max_names=settings.max_layers_exposed,
        on_skip=metrics.background_errors.labels(part="chart_history").inc)
    # Last of all, on the engine thread (after any tick still running there): closing
    # checkpoints the alert database's WAL into alerts.sqlite.
    opened.push_async_callback(runner.call, alerting.db.close)
    opened.push_async_callback(runner.call, _shutdown, engine, store)
    opened.callback(alerting.stop, timeout=5.0)
    opened.callback(history.stop)
    # A node sidecar's link to its run leaders (one run, one brain: cluster/); stopped
    # before the engine it reads from.
    probe = tcp_probe(settings, runner, engine)
    link = leader_link(settings, runner, engine, alerting, metrics, services.sidecar, probe)
    opened.callback(link.stop)
    if probe is not None:
        opened.callback(probe.stop)
    services.readiness.repairs[HISTORY_SOURCE] = history.request_repair
    services.readiness.watch(history.problem)
    services.readiness.watch(alerting.problem)
    history.start()
    # Last: its presence means "open" to the storage gate.
    services.backends = Backends(engine, queries, alerting, exposition)
    alerting.start()
    link.start()
    if probe is not None:
        probe.start()
    services.readiness.set(unwritable)


def _not_ready(services: Services, exc: BaseException) -> None:
    reason = f"storage: cannot open {services.settings.data_dir}: {exc}"
    if isinstance(exc, StorageError) and exc.corrupt:
        services.readiness.failed(exc)  # logged there; not retried: waiting mends no file
        services.readiness.set(reason)
        return
    if services.readiness.reason != reason:
        log.error("%s; retrying every %ss", reason, services.settings.tick_interval_seconds)
    services.readiness.set(reason)


async def _open_when_possible(services: Services, opened: contextlib.AsyncExitStack) -> None:
    while not services.readiness.broken:
        await asyncio.sleep(services.settings.tick_interval_seconds)
        try:
            await _open(services, opened)
        except STORAGE_ERRORS as exc:
            _not_ready(services, exc)
            continue
        log.info("storage at %s is writable again; ready", services.settings.data_dir)
        await _tick_forever(services)


class StorageGate:
    """503 for every route but the health checks while the databases are not open.

    A plain ASGI middleware: as ``app.middleware("http")`` (Starlette's
    ``BaseHTTPMiddleware``) it cost every request a task and a pair of memory streams,
    a third of the event loop's time per request at a run leader hearing 128 nodes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path") not in ("/healthz", "/readyz"):
            found: Services = scope["app"].state.services
            if not found.open:
                answer = JSONResponse(
                    {"detail": f"not ready: {found.readiness.why_not}; retry later"},
                    status_code=503, headers={"Retry-After": "5"})
                await answer(scope, receive, send)
                return
        await self.app(scope, receive, send)


def write_headroom(settings: Settings) -> int:
    """Free bytes needed to call the store writable again: room for one more request."""
    cap = settings.max_db_bytes // 8 if settings.max_db_bytes else settings.max_body_bytes
    return min(settings.max_body_bytes, cap)


def _shutdown(engine: Engine, store: Store) -> None:
    try:
        engine.registry.snapshot_all()
    except StorageError:
        log.warning("could not save detector state at shutdown; the tail replays on restart")
    store.close()


async def _tick_forever(services: Services) -> None:
    settings, runner, readiness = services.settings, services.runner, services.readiness
    engine, alerting = services.engine, services.alerting
    # Stalls, resolves, snapshots and retention live in the tick: while it fails (a bug),
    # /readyz says so instead of the sidecar looking healthy with none of them happening.
    failing: list[str] = []
    readiness.watch(lambda: f"engine tick failing: {failing[0]}" if failing else None)
    while True:
        await asyncio.sleep(settings.tick_interval_seconds)
        try:
            await runner.call(engine.tick, time.time())
            failing.clear()
            if not readiness.ready:
                await runner.call(engine.store.check_writable, write_headroom(settings))
                await runner.call(alerting.check_writable)
                readiness.set(None)
        except StorageError as exc:  # "alert storage": a page could not be made durable
            readiness.failed(exc)
        except Exception as exc:
            log.exception("tick failed")
            failing[:] = [f"{type(exc).__name__}: {limits.safe(str(exc), 200)}"]
