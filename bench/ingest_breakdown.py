"""Where a batch's milliseconds go on the sidecar's ingest path, stage by stage.

The same payload as bench/ingest.py (148 tensors x 7 statistics + 12 scalars a step,
batches of 10 steps, gzip NDJSON), driven through the very functions ``POST /v1/records``
calls, in process, without HTTP: the body decoded (inflate + JSON parse), each record
validated (pydantic, the dataclass), then the engine on a real SQLite store in a temporary
directory with real alerting (its own SQLite database): admit, store (one transaction),
apply, detect, alert (judge, route, the batch's alert state made durable) and the rest of
the engine's walk (goodput ledger, digests, snapshots), then the answer serialised. Each
stage is timed by wrapping the stage objects' methods of that one engine; what the
engine does outside them is ``engine other``.

    python -m bench.ingest_breakdown [--batches 300] [--warmup 50]

Prints per stage the mean ms a batch and its share of the total, in the CPU time of the
thread (``time.thread_time``: on a shared machine, what other processes take of the cores
does not count), and the wall time beside it. The HTTP server's own work (uvicorn, FastAPI
routing, the thread hops) is not here: bench/ingest.py's p50 minus this total is about
that.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from bench.ingest import BATCH, SAMPLES_PER_STEP, sidecar_bodies
from monitor_agent.alerting.service import Alerting
from monitor_agent.api.body import decode
from monitor_agent.api.ingest import IngestAttemptOut, IngestResponse
from monitor_agent.api.record_batch import sorted_rejections, validate_records
from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline import engine as engine_module
from monitor_agent.pipeline.engine import Engine
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

HEADERS = {"content-type": "application/x-ndjson", "content-encoding": "gzip"}
STAGES = ("parse", "validate", "admit", "store", "apply", "detect", "alert", "engine other",
          "answer")


class Clocks:
    """Seconds spent per stage; nested stages are subtracted from their parents."""

    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._inner: list[float] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            self._inner.append(0.0)
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                took = time.thread_time() - t0
                inner = self._inner.pop()
                self.spent[name] += took - inner
                if self._inner:
                    self._inner[-1] += took
        return timed


def instrument(engine: Engine, clocks: Clocks) -> None:
    """The engine's stage objects' methods, each through ``clocks``."""
    walk = engine.walk
    engine.admission.admit = clocks.wrap("admit", engine.admission.admit)  # type: ignore[method-assign]
    engine_module.keep = clocks.wrap("store", engine_module.keep)  # type: ignore[attr-defined]
    walk.state.apply = clocks.wrap("apply", walk.state.apply)  # type: ignore[method-assign]
    walk.state.cap_layers = clocks.wrap("apply", walk.state.cap_layers)  # type: ignore[method-assign]
    walk.detection.detect = clocks.wrap("detect", walk.detection.detect)  # type: ignore[method-assign]
    walk.judge.judge = clocks.wrap("alert", walk.judge.judge)  # type: ignore[method-assign]
    walk.router.route = clocks.wrap("alert", walk.router.route)  # type: ignore[method-assign]
    engine.batch_end.finish = clocks.wrap("alert", engine.batch_end.finish)  # type: ignore[method-assign]
    engine.ingest = clocks.wrap("engine other", engine.ingest)  # type: ignore[method-assign]


def answer(result: Any) -> bytes:
    """The 200 answer, as api/ingest.py builds and serialises it."""
    return IngestResponse(
        accepted=result.accepted, duplicates=result.duplicates, late=result.late,
        rejected=sorted_rejections(list(result.rejected)), actions=result.actions,
        attempts=[IngestAttemptOut(token=token, **view)
                  for (_, token), view in result.attempts.items()],
    ).model_dump_json().encode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=50)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-breakdown-"))
    settings = Settings(data_dir=tmp)
    tmp.mkdir(exist_ok=True)
    store = Store(settings.db_path, max_bytes=settings.max_db_bytes)
    registry = CollectorRegistry()
    alerting = Alerting(settings.alerting, settings.alerts_db_path, registry)
    engine = Engine(settings, store, SelfMetrics(registry), alerting)
    clocks = Clocks()
    parse = clocks.wrap("parse", decode)
    validate = clocks.wrap("validate", validate_records)
    respond = clocks.wrap("answer", answer)
    instrument(engine, clocks)
    bodies = sidecar_bodies(0, args.warmup + args.batches)
    try:
        total = wall = 0.0
        for i, body in enumerate(bodies):
            if i == args.warmup:
                clocks.spent.clear()
                total = wall = 0.0
            t0, w0 = time.thread_time(), time.perf_counter()
            valid, rejected = validate(parse(body, HEADERS, settings),
                                       settings.max_record_bytes, time.time())
            assert not rejected, rejected
            result = engine.ingest(valid, time.time(), "127.0.0.1")
            assert result.accepted == BATCH, result
            respond(result)
            total += time.thread_time() - t0
            wall += time.perf_counter() - w0
    finally:
        alerting.db.close()
        store.close()
        shutil.rmtree(tmp, ignore_errors=True)
    n = args.batches
    print(f"payload: batches of {BATCH} steps x {SAMPLES_PER_STEP} samples (gzip ndjson), "
          f"{n} batches after {args.warmup} warm-up")
    print(f"{'stage':14} {'cpu ms/batch':>12} {'share':>7}")
    for stage in STAGES:
        ms = 1e3 * clocks.spent.get(stage, 0.0) / n
        print(f"{stage:14} {ms:>12.3f} {100 * ms / (1e3 * total / n):>6.1f}%")
    print(f"{'total':14} {1e3 * total / n:>12.3f} {100.0:>6.1f}%")
    print(f"wall ms/batch: {1e3 * wall / n:.3f}")
    print(f"samples/s in process, per CPU second: {n * BATCH * SAMPLES_PER_STEP / total:.0f}")


if __name__ == "__main__":
    main()
