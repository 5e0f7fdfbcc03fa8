"""The read side: what the API and the UI ask of runs, answered as copies.

Live run state is written by the engine thread only (pipeline/runner.py); a handler that read it on
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

import bisect
import time
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from monitor_agent.pipeline import recovery
from monitor_agent.pipeline.registry import RunRegistry
from monitor_agent.reads import views
from monitor_agent.records import wire
from monitor_agent.runs.checkpoint_ledger import CheckpointLedger, Judged, LedgerEntry
from monitor_agent.runs.ettr import ettr_of
from monitor_agent.runs.run_state import RunState
from monitor_agent.storage.store import Store, StoredRun


class RunQueries:
    """Read-only questions about runs, stored and live (engine thread)."""

    def __init__(self, store: Store, registry: RunRegistry) -> None:
        self.store = store
        self.registry = registry
        # Goodput ratios of runs out of memory, by run id, with the run's last_seen when
        # read: a stored ledger changes only while its run is in memory, which moves
        # last_seen (so the runs lists decode each stored ledger once, not every poll).
        self._stored_ratios: dict[str, tuple[float, float | None]] = {}
        # The ledger of the last run out of memory whose checkpoints were read, with its
        # last_seen (as above): paging through or polling a stored run loads it once.
        self._stored_ledger: tuple[str, float, CheckpointLedger] | None = None

    def _live(self, run_id: str) -> RunState | None:
        live = self.registry.get(run_id)
        return live.state if live is not None else None

    def exposed_runs(self) -> list[RunState]:
        """The runs /metrics renders. The one query called from another thread (the
        scrape's worker): ``RunRegistry.states`` is atomic under the GIL, and the renderer
        caches each run by its ``version``. Rendering on the engine thread instead would
        hold ingest for the whole render (~100 ms at 100k series, bench/exposition.py)."""
        return self.registry.states()

    def run_listings(self, now: float | None = None) -> list[views.RunListing]:
        """Every stored run, oldest first (``GET /v1/runs``): its fields from the store
        where the run is not in memory, so leaving memory changes none of them."""
        return [self._listing(row, now) for row in self.store.runs()]

    def _listing(self, row: StoredRun, now: float | None = None) -> views.RunListing:
        live = self._live(row.run_id)
        return views.listing(
            row, live, row.last_step,
            sum(self.store.finding_counts(row.run_id).values()),
            max(1, len(self.store.attempts(row.run_id))),
            self.goodput_ratio(row, live, now))

    def goodput_ratio(self, row: StoredRun, live: RunState | None,
                      now: float | None = None) -> float | None:
        """The run's goodput ratio as ``goodput`` reports it (None before any time): a live
        run's ledger, or the one last kept for a run out of memory. ``now``: sidecar time
        (default: the clock), which only an open hang's cost follows."""
        now = time.time() if now is None else now
        if live is not None:
            self._stored_ratios.pop(row.run_id, None)
            return live.goodput.report(live.clock(now) or now).ratio
        cached = self._stored_ratios.get(row.run_id)
        if cached is not None and cached[0] == row.last_seen:
            return cached[1]
        book = self.registry.stored_goodput(row.run_id)
        ratio = book.report(now).ratio
        if book.hang is None:  # an open hang's cost grows with the clock
            self._stored_ratios[row.run_id] = (row.last_seen, ratio)
        return ratio

    def listings_chunk(self, after: tuple[float, str] | None, max_rows: int,
                       max_bytes: int, now: float | None = None,
                       ) -> list[tuple[tuple[float, str], bytes]]:
        """The next stored runs of a ``GET /v1/runs`` page as JSON, each with its key
        ``(first_seen, run_id)``: at most ``max_rows``, and ``max_bytes`` (but at least one)."""
        out: list[tuple[tuple[float, str], bytes]] = []
        total = 0
        for row in self.store.runs_chunk(after, max_rows):
            body = wire.dumps(asdict(self._listing(row, now)))
            if out and total + len(body) > max_bytes:
                break
            out.append(((row.first_seen, row.run_id), body))
            total += len(body)
        return out

    def run_summaries(self, now: float | None = None) -> list[views.RunSummary]:
        """Every stored run with its progress, worst finding and goodput (the runs page)."""
        out = []
        for row in self.store.runs():
            live = self._live(row.run_id)
            last = None
            if live is None:
                body = self.store.last_record(row.run_id, 0, "step")
                last = wire.loads(body).get("step") if body is not None else None
            severities = self.store.finding_severity_counts(row.run_id)
            out.append(views.summary(row, live, severities, last,
                                     self.goodput_ratio(row, live, now)))
        return out

    def run_detail(self, run_id: str) -> views.RunDetail | None:
        """A run's status, ranks and findings (``GET /v1/runs/{id}``); None: no such run."""
        row = self.store.run_row(run_id)
        if row is None:
            return None
        live = self._live(run_id)
        return views.detail(row, live, self.store.finding_counts(run_id),
                            self.store.findings(run_id, limit=20), row.last_step,
                            views.attempt_views(self.store.attempts(run_id),
                                                live.verdict.rollbacks if live else ()))

    def checkpoints(self, run_id: str, after: tuple[int, int] | None = None,
                    limit: int | None = None, start: int | None = None,
                    end: int | None = None,
                    ) -> tuple[list[Judged], LedgerEntry | None] | None:
        """A slice of the run's checkpoint ledger, judged (``GET /v1/runs/{id}/checkpoints``,
        runs/checkpoint_ledger.py), oldest first: those after ``after`` (step, attempt
        number), at most ``limit``, or those of steps ``start``..``end``; with the last
        clean one. None: no such run. A slice costs O(log n + its length) once the ledger
        has judged its entries (``CheckpointLedger.judged``); they are immutable, so the
        caller turns them into JSON off the engine thread."""
        ledger = self._ledger(run_id)
        if ledger is None:
            return None
        judged = ledger.judged()
        lo, hi = 0, len(judged)
        if after is not None:
            lo = bisect.bisect_right(judged, after, key=checkpoint_key)
        if start is not None:
            lo = max(lo, bisect.bisect_left(judged, start, key=lambda j: j.entry.step))
        if end is not None:
            hi = bisect.bisect_right(judged, end, key=lambda j: j.entry.step)
        if limit is not None:
            hi = min(hi, lo + limit)
        return judged[lo:hi], ledger.last_clean()

    def _ledger(self, run_id: str) -> CheckpointLedger | None:
        live = self._live(run_id)
        if live is not None:
            return live.ledger
        row = self.store.run_row(run_id)
        if row is None:
            return None
        cached = self._stored_ledger
        if cached is not None and cached[0] == run_id and cached[1] == row.last_seen:
            return cached[2]
        ledger = recovery.stored_ledger(self.store, run_id)
        self._stored_ledger = (run_id, row.last_seen, ledger)
        return ledger

    def goodput(self, run_id: str, now: float) -> dict[str, Any] | None:
        """Where the run's time went (``GET /v1/runs/{id}/goodput``, runs/goodput.py);
        None: no such run."""
        live = self._live(run_id)
        if live is not None:
            book = live.goodput
            now = live.clock(now) or now
        elif self.store.run_row(run_id) is not None:
            book = self.registry.stored_goodput(run_id)
        else:
            return None
        report = book.report(now).to_dict()
        figures = ettr_of(report, report["goodput_ratio"])
        return {"run_id": run_id, **report, "ettr": figures.to_dict()}

    def node_verdicts(self, run_id: str) -> dict[str, Any] | None:
        """Each node of the run judged (``GET /v1/runs/{id}/nodes``, runs/node_verdict.py);
        None: no such run. A run out of memory has none (its verdicts live with it)."""
        live = self._live(run_id)
        if live is None:
            return {"run_id": run_id, "nodes": []} if self.store.run_row(run_id) else None
        hosts = live.hosts()
        nodes = live.node_verdicts() if len(set(hosts.values())) >= 2 else []
        return {"run_id": run_id, "nodes": [v.to_dict() for v in nodes]}

    def records_chunk(self, run_id: str, since_step: int, after: tuple[int, int, int] | None,
                      kinds: Sequence[str], max_rows: int, max_bytes: int,
                      attempt: int | None = None,
                      ) -> list[tuple[tuple[int, int, int], bytes]] | None:
        """The next chunk of a run's stored record lines, oldest step first
        (``Store.records_chunk``): its current history, or what ``attempt`` sent; None when
        the run is unknown."""
        rows = self.store.records_chunk(run_id, since_step, after, kinds, max_rows, max_bytes,
                                        attempt)
        if not rows and self.store.run_row(run_id) is None:
            return None
        return rows

    def findings_chunk(self, run_id: str, before_id: int | None, max_rows: int,
                       max_bytes: int, current: bool = False) -> list[tuple[int, bytes]]:
        """The next chunk of a run's stored finding lines, newest first (``current``: of
        its current history)."""
        return self.store.findings_chunk(run_id, before_id, max_rows, max_bytes, current)


def checkpoint_key(judged: Judged) -> tuple[int, int]:
    """Where a checkpoint stands in the ledger's order: (step, attempt number)."""
    return (judged.entry.step, judged.entry.attempt)
