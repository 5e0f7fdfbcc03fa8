"""What a reused run id costs: a relaunch that resumes a long run from a checkpoint.

One rank of a run sends ``--steps`` steps (scalars, the per-layer stats of ``--layers``
tensors every 25 steps, as the client sends by default) through the real engine and a
real SQLite store on disk, its detectors snapshotted every ``--snapshot-every`` steps (the
sidecar does so every 10 s); then a second process (a new attempt token) resumes
``--back`` steps before the end. Prints the ingest rate before, the one-off cost of the
first resumed batch (the history it replaced is marked in one transaction and the run is
rebuilt from the newest snapshot below the resume step plus the kept records after it,
quietly), the ingest rate after, and what the read side costs per request for the run
(detail, listing) once it left memory. ``--snapshot-every 0``: no snapshot, the rebuild
feeds every kept step.

    python -m bench.attempts [--steps 20000] [--back 1000] [--snapshot-every 1000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.reads.queries import RunQueries
from monitor_agent.records import schemas
from monitor_agent.settings import Settings
from monitor_agent.storage.store import Store

BATCH = 10


def _batch(token: str, steps: range, layers: int) -> list[Incoming]:
    out = []
    for i, s in enumerate(steps):
        rec: dict = {"kind": "step", "run_id": "bench", "step": s, "time": 1000.0 + s,
                     "attempt": token, "loss": 2.0 + 1.0 / s, "lr": 3e-4, "grad_norm": 1.0,
                     "param_norm": 50.0, "update_norm": 0.01, "step_time": 0.1}
        if s % 25 == 0:
            rec["layers"] = {f"h.{n}.weight": {"grad_norm": 0.1, "param_norm": 2.0,
                                                "update_norm": 0.001} for n in range(layers)}
        out.append(Incoming(i, *schemas.parse_for_store(rec)))
    return out


def _send(engine: Engine, token: str, first: int, last: int, layers: int) -> float:
    """Steps per second of ``first..last`` through the engine, in batches of BATCH."""
    t0 = time.perf_counter()
    for start in range(first, last + 1, BATCH):
        engine.ingest(_batch(token, range(start, min(start + BATCH, last + 1)), layers),
                      now=float(start))
    return (last - first + 1) / (time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--layers", type=int, default=150)
    ap.add_argument("--back", type=int, default=1000)
    ap.add_argument("--snapshot-every", type=int, default=1000)
    args = ap.parse_args()
    n, half = args.steps, args.steps - args.back
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "monitor.sqlite")
        engine = Engine(Settings(), store, SelfMetrics(CollectorRegistry()))
        every = args.snapshot_every or n
        t0 = time.perf_counter()
        for first in range(1, n + 1, every):
            _send(engine, "first", first, min(first + every - 1, n), args.layers)
            if args.snapshot_every:
                engine.registry.snapshot_all()
        before = n / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        engine.ingest(_batch("second", range(half, half + BATCH), args.layers), now=n + 1.0)
        first_batch = time.perf_counter() - t0
        after = _send(engine, "second", half + BATCH, n + half, args.layers)
        engine.registry.expire(now=1e12)  # the run leaves memory: reads from the store
        queries, reps = RunQueries(store, engine.registry), 50
        t0 = time.perf_counter()
        for _ in range(reps):
            queries.run_detail("bench")
        detail_ms = (time.perf_counter() - t0) / reps * 1e3
        t0 = time.perf_counter()
        for _ in range(reps):
            queries.run_listings()
        listing_ms = (time.perf_counter() - t0) / reps * 1e3
        store.close()
    print(f"run of {n} steps, {args.layers} layers every 25 steps, snapshots every "
          f"{args.snapshot_every or 'never'}; resumed at step {half}")
    print(f"ingest before the resume      {before:10.0f} steps/s")
    print(f"first resumed batch           {first_batch * 1e3:10.1f} ms  (marks steps "
          f"{half}-{n} abandoned, rebuilds the run at step {half - 1})")
    print(f"ingest after the resume       {after:10.0f} steps/s")
    print(f"GET /v1/runs/{{id}} read side  {detail_ms:10.2f} ms  (run not in memory)")
    print(f"GET /v1/runs read side        {listing_ms:10.2f} ms")


if __name__ == "__main__":
    main()
