"""``Readiness``: whether the sidecar can store records now, and what ``/readyz`` reports.

serving/app.py builds one at startup (``Services.readiness``); the storage gate and ingest
ask ``ready``, routes that meet a ``StorageError`` report it with ``failed``. A new one is
not ready until the databases open::

    >>> from prometheus_client import CollectorRegistry
    >>> readiness = Readiness(SelfMetrics(CollectorRegistry()))
    >>> readiness.ready, readiness.problems()
    (False, ['starting'])
    >>> readiness.set(None)
    >>> readiness.watch(lambda: "chart history: thread stopped")
    >>> readiness.ready, readiness.problems()
    (True, ['chart history: thread stopped'])
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.storage.database import StorageError

log = logging.getLogger(__name__)


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
