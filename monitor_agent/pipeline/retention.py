"""``Retention``: the store keeps each (run, rank)'s last ``retention_steps`` steps, pruned
a slice at a time on the engine's tick.

Pruning a minute's worth at once held the engine thread for seconds (ingest p99 went from
0.15 to 3 s in the soak), so every tick prunes at most ``PRUNE_ROWS_PER_TICK`` rows and
visits every (run, rank) once per ``PRUNE_PASS_TICKS`` ticks.

The engine holds one (``Engine.retention``, of ``settings.retention_steps``) and calls
``prune_some`` on every tick; here, one keeping three steps of a run that sent ten::

    >>> from prometheus_client import CollectorRegistry
    >>> from monitor_agent.metrics.sidecar import SelfMetrics
    >>> from monitor_agent.pipeline.engine import Engine, Incoming
    >>> from monitor_agent.records import schemas, wire
    >>> from monitor_agent.settings import Settings
    >>> engine = Engine(Settings(), Store(":memory:"), SelfMetrics(CollectorRegistry()))
    >>> steps = [{"kind": "step", "run_id": "r1", "step": n, "time": float(n)}
    ...          for n in range(1, 11)]
    >>> _ = engine.ingest([Incoming(i, *schemas.parse_for_store(s))
    ...                    for i, s in enumerate(steps)], now=10.0)
    >>> Retention(engine.store, retention_steps=3).prune_some(engine.registry.states())
    >>> [wire.loads(body)["step"] for body in engine.store.records("r1")]
    [8, 9, 10]
"""

from __future__ import annotations

import collections
from collections.abc import Iterable

from monitor_agent.runs.run_state import RunState
from monitor_agent.storage.store import Store

PRUNE_PASS_TICKS = 10      # ticks (seconds) per full retention pass over the runs
PRUNE_ROWS_PER_TICK = 5000


class Retention:
    """A round-robin queue of (run, rank) keys and the rows budget of one tick."""

    def __init__(self, store: Store, retention_steps: int) -> None:
        self.store = store
        self.retention_steps = retention_steps
        self._queue: collections.deque[tuple[str, int]] = collections.deque()

    def prune_some(self, live: Iterable[RunState]) -> None:
        runs = {run.run_id: run for run in live}
        if not self._queue:
            self._queue.extend((run.run_id, rank) for run in runs.values()
                               for rank in run.ranks)
        keys = -(-len(self._queue) // PRUNE_PASS_TICKS)  # ceil: the pass ends in time
        budget = PRUNE_ROWS_PER_TICK
        for _ in range(keys):
            if not self._queue or budget <= 0:
                return
            run_id, rank = self._queue.popleft()
            state = runs[run_id].ranks.get(rank) if run_id in runs else None
            # Keep the steps after last_step - retention_steps (optimizer steps count up),
            # and never fewer than retention_steps records: one far-ahead step must not
            # make the run's history look old.
            retention = self.retention_steps
            through = state.last_step - retention if state else -1
            if through >= 0:
                oldest_kept = self.store.nth_newest_step(run_id, rank, retention)
                if oldest_kept is not None:
                    through = min(through, oldest_kept - 1)
                    budget -= self.store.prune(run_id, rank, through, budget)
