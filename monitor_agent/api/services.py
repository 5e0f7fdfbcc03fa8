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

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import HTTPException, Request
from prometheus_client import CollectorRegistry

from monitor_agent.alerting import Alerting
from monitor_agent.api.streamed_page import ReadSlots
from monitor_agent.metrics.exposition import Exposition
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine
from monitor_agent.pipeline.queries import RunQueries
from monitor_agent.pipeline.runner import EngineRunner
from monitor_agent.settings import Settings
from monitor_agent.storage.database import StorageError

log = logging.getLogger(__name__)
AUTH_LOG_INTERVAL_S = 60.0


class Readiness:
    """Whether the sidecar can store records now, and why not; and whether every part of
    it works (``problems``: what ``/readyz`` reports).

    Three kinds of trouble, each with one home:

    - ``reason``: a passing condition of the record store (starting, a full disk); the
      tick clears it once a write succeeds again.
    - ``broken``: a database found corrupt (``StorageError.corrupt``). Waiting does not
      heal that, so it stays until the process restarts, unless the database has a
      ``repairs`` entry (the chart history, derived data, is rebuilt from the records):
      then the repair is asked for instead and the database's own check reports progress.
    - ``watch``ed checks: each background part (the chart history's thread, alerting's
      threads) answers "what is wrong with me now", so a thread that died or cannot work
      shows in ``/readyz`` without any of them writing shared state.

    ``ready`` gates ingest: records are refused only while the record or alert store
    cannot take them; a broken chart history costs charts, never a record.
    """

    def __init__(self, metrics: SelfMetrics) -> None:
        self._metrics = metrics
        self.reason: str | None = "starting"
        self.broken: dict[str, str] = {}
        self.repairs: dict[str, Callable[[], None]] = {}
        self._checks: list[Callable[[], str | None]] = []

    @property
    def ready(self) -> bool:
        return self.reason is None and not self.broken

    @property
    def why_not(self) -> str | None:
        """Why records cannot be stored now (None when ``ready``)."""
        found = ([self.reason] if self.reason is not None else []) + list(self.broken.values())
        return "; ".join(found) or None

    def set(self, reason: str | None) -> None:
        self.reason = reason
        self._metrics.ready.set(1 if self.ready else 0)

    def failed(self, exc: StorageError) -> None:
        """A storage failure seen at runtime: corrupt is repaired or remembered, anything
        else is the passing ``reason`` (as a full disk always was)."""
        if not exc.corrupt:
            if exc.source == "storage" or exc.source == "alert storage":
                self.set(f"{exc.source}: {exc}")
            return
        repair = self.repairs.get(exc.source)
        if repair is not None:
            repair()
            return
        if exc.source not in self.broken:
            log.error("%s is corrupt (%s); not ready until its database is restored from "
                      "a backup and the sidecar restarted", exc.source, exc)
        self.broken[exc.source] = f"{exc.source} is corrupt: {exc}"
        self.set(self.reason)

    def watch(self, check: Callable[[], str | None]) -> None:
        """Ask ``check`` on every ``/readyz``: None when its part works, else why not."""
        self._checks.append(check)

    def problems(self) -> list[str]:
        """Everything wrong now, storage first; empty when ready and every part works."""
        blocking = self.why_not
        found = [blocking] if blocking is not None else []
        for check in self._checks:
            problem = check()
            if problem is not None:
                found.append(problem)
        return found


class RejectionLog:
    """Rate-limited log of 401s: one line per interval, counting what it held back.

    An operator should see that a client is misconfigured, not one line per request; the
    token itself is never logged.
    """

    def __init__(self, interval: float = AUTH_LOG_INTERVAL_S) -> None:
        self.interval = interval
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._held = 0

    def rejected(self, request: Request, why: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._last < self.interval:
                self._held += 1
                return
            self._last, held, self._held = now, self._held, 0
        client = request.client.host if request.client else "?"
        more = f" ({held} more since the last such line)" if held else ""
        log.warning("401 for %s %s from %s: %s%s", request.method, request.url.path, client,
                    why, more)


class TokenHealth:
    """Whether the configured token could be read at the last guarded request; each change
    is logged once (an outage is an error until fixed, not a line per request)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reason: str | None = None

    def unavailable(self, reason: str) -> None:
        with self._lock:
            changed, self.reason = self.reason != reason, reason
        if changed:
            log.error("bearer token unavailable: %s; every guarded route answers 503 until "
                      "it is fixed", reason)

    def available(self) -> None:
        if self.reason is None:  # the common case: no lock, nothing to say
            return
        with self._lock:
            was, self.reason = self.reason, None
        if was is not None:
            log.warning("bearer token readable again; guarded routes accept it")


@dataclass(frozen=True, slots=True)
class Backends:
    """What exists only once the databases are open."""

    engine: Engine
    queries: RunQueries
    alerting: Alerting
    exposition: Exposition


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
