"""/metrics render time at 10k and 100k series vs prometheus_client, and RSS per series.

Runs are fed through the real engine (detectors included) so memory counts everything a
live run costs. Render time is measured cold (every run changed since the last scrape,
the worst case during training) and warm (nothing changed); prometheus_client's
``generate_latest`` renders the very same series from Gauges for comparison.

    python -m bench.exposition [--layers 320] [--steps 30]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import psutil
from prometheus_client import CollectorRegistry, Gauge, generate_latest

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.reads.exposition import Exposition
from monitor_agent.records import schemas
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def feed(engine: Engine, runs: int, layers: int, steps: int) -> None:
    names = [f"blocks.{i // 4}.w{i % 4}.weight" for i in range(layers)]
    for r in range(runs):
        run_id = f"run-{r}"
        items = [Incoming(0, *schemas.parse_for_store({
            "kind": "run", "run_id": run_id, "time": 0.0, "labels": {"project": "bench"},
            "config": {"total_steps": 1000}, "model": {"layer_order": names}}))]
        for s in range(1, steps + 1):
            rec = {"kind": "step", "run_id": run_id, "step": s, "time": float(s),
                   "loss": 3.0 / s ** 0.1, "lr": 1e-3, "grad_norm": 1.0, "param_norm": 50.0,
                   "update_norm": 0.05, "tokens": 4096, "samples": 8, "step_time": 0.3,
                   "data_time": 0.001, "tokens_per_second": 13000, "mfu": 0.4,
                   "memory": {"allocated_bytes": 1e9, "total_bytes": 8e10},
                   "layers": {n: {"grad_norm": 0.01 * (1 + i % 7), "grad_mean": 0.0,
                                  "grad_std": 1e-4, "grad_max_abs": 1e-3,
                                  "grad_zero_frac": 0.0, "param_norm": 1.0,
                                  "update_norm": 1e-3} for i, n in enumerate(names)}}
            items.append(Incoming(s, *schemas.parse_for_store(rec)))
        for i in range(0, len(items), 10):
            engine.ingest(items[i:i + 10], now=time.time())


def series_count(text: bytes) -> int:
    return sum(1 for line in text.split(b"\n") if line and line.startswith(b"training_"))


def time_it(fn, repeat: int = 5) -> float:
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def client_registry(text: bytes) -> CollectorRegistry:
    """The same series as prometheus_client Gauges (histogram buckets as gauges too)."""
    registry = CollectorRegistry()
    families: dict[str, tuple[Gauge, list[str]]] = {}
    for line in text.decode().splitlines():
        if not line.startswith("training_"):
            continue
        head, value = line.rsplit(" ", 1)
        name, _, labels = head.partition("{")
        pairs = [p.split("=", 1) for p in labels.rstrip("}").split('",') if p]
        keys = [k for k, _ in pairs]
        vals = [v.strip('"') for _, v in pairs]
        if name not in families:
            families[name] = (Gauge(name, name, keys, registry=registry), keys)
        gauge, expected = families[name]
        if keys == expected:
            gauge.labels(*vals).set(float(value.replace("+Inf", "inf")))
    return registry


def measure(runs: int, layers: int, steps: int) -> tuple[int, int]:
    proc = psutil.Process()
    gc.collect()
    rss0 = proc.memory_info().rss
    with tempfile.TemporaryDirectory() as tmp:
        settings = load_settings(data_dir=Path(tmp), max_layers_exposed=100_000)
        registry = CollectorRegistry()
        engine = Engine(settings, Store(settings.db_path), SelfMetrics(registry))
        feed(engine, runs, layers, steps)
        exp = Exposition(engine.registry.states, registry,
                         max_runs=100_000, max_layers=100_000)
        text = exp.render()
        gc.collect()
        rss1 = proc.memory_info().rss
        n = series_count(text)

        def cold() -> None:
            for run in engine.registry.states():
                run.version += 1
            exp.render()

        t_cold, t_warm = time_it(cold), time_it(exp.render)
        reg = client_registry(text)
        t_client = time_it(lambda: generate_latest(reg))
        print(f"{n:>8} {runs:>5} {layers:>6} {t_cold * 1e3:>9.1f} {t_warm * 1e3:>9.1f} "
              f"{t_client * 1e3:>11.1f} {t_client / t_cold:>7.1f}x {(rss1 - rss0) / n:>10.0f}")
        engine.store.close()
        return n, rss1 - rss0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=320)
    ap.add_argument("--steps", type=int, default=30)
    args = ap.parse_args()
    per_run = 3 * args.layers + 45
    print(f"{'series':>8} {'runs':>5} {'layers':>6} {'cold ms':>9} {'warm ms':>9} "
          f"{'client ms':>11} {'speedup':>8} {'B/series':>10}")
    results = [measure(max(1, round(t / per_run)), args.layers, args.steps)
               for t in (10_000, 100_000)]
    (n1, m1), (n2, m2) = results
    # The first figure carries fixed costs (SQLite cache, first allocations); the slope
    # between the two sizes is what one more series costs.
    print(f"marginal RSS per series between the two sizes: {(m2 - m1) / (n2 - n1):.0f} B")


if __name__ == "__main__":
    main()
