"""What the startup integrity check costs: ``PRAGMA quick_check`` on a record store of a
given size, the time the sidecar spends on it before it is ready (``Store.check_integrity``;
the chart history's check runs on its own thread and delays only the charts).

The store is filled with real-shaped step records (``--layers`` layers of stats each) in
bulk, closed (so the WAL is checkpointed into the file, as after a clean stop), and the
page cache is not dropped: the figure is the warm-cache cost, the common restart case.

Example::

    python -m bench.state_checks                  # 20,000 steps of 150 layers
    python -m bench.state_checks --steps 100000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import orjson

from monitor_agent.storage.store import RecordRow, Store


def _fill(path: Path, steps: int, layers: int) -> None:
    store = Store(path)
    stats = {f"blocks.{i}.weight": {"grad_norm": 0.1 + i * 1e-3, "param_norm": 10.0 + i,
                                    "update_norm": 1e-3, "grad_mean": 1e-6, "grad_std": 1e-3}
             for i in range(layers)}
    batch = []
    for step in range(1, steps + 1):
        body = orjson.dumps({"kind": "step", "run_id": "bench", "step": step,
                             "time": 1000.0 + step, "loss": 2.0 + 1.0 / step,
                             "layers": stats})
        batch.append(RecordRow("bench", 0, "step", step, 1000.0 + step, body))
        if len(batch) == 500:
            store.insert_records(batch)
            batch = []
    if batch:
        store.insert_records(batch)
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000)
    parser.add_argument("--layers", type=int, default=150)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "monitor.sqlite"
        _fill(path, args.steps, args.layers)
        size = path.stat().st_size
        times = []
        for _ in range(args.repeat):
            store = Store(path)
            t0 = time.perf_counter()
            store.check_integrity()
            times.append(time.perf_counter() - t0)
            store.close()
    best = min(times)
    print(f"store of {args.steps} steps x {args.layers} layers: {size / 2**20:.0f} MiB; "
          f"quick_check best of {args.repeat}: {best:.2f} s ({best / (size / 2**30):.2f} s/GiB)"
          f"; all: {', '.join(f'{t:.2f}' for t in times)} s")


if __name__ == "__main__":
    main()
