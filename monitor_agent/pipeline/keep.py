"""The store stage: an admitted batch's records kept in one transaction, before anything
is judged (a record is acknowledged only once stored; its effects follow)."""

from __future__ import annotations

import time
from collections.abc import Sequence

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.batch import Admitted
from monitor_agent.storage.store import Store


def keep(store: Store, metrics: SelfMetrics, admitted: Sequence[Admitted]) -> list[int | None]:
    """Store the admitted records; the row id of each, None for a duplicate (a client's
    retry: stored once, judged once). Raises StorageError (-> 503): nothing was kept."""
    t0 = time.perf_counter()
    ids = store.insert_records([a.row() for a in admitted])
    metrics.store_duration.observe(time.perf_counter() - t0)
    return ids
