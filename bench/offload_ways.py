"""Whole steps of a small CPU loop with its gradient norms read each way: beside the
optimizer's step (a worker thread), on the training thread, and as the client chooses
(``WayChooser`` in client/monitor_client/_norm_worker.py), interleaved in rounds.

Whether the read beside the step pays depends on a free core: this says, on this machine
now, which way is faster and whether the choice lands on it. The same MLPs as
``bench/tiny_steps.py`` (a 1 ms and a 10 ms step with one torch thread, AdamW), each way
its own copy and Monitor (to a loopback sink); per round each runs ``--steps`` steps, the
order reversed every other round; the median step of each round, the median over rounds.

    python -m bench.offload_ways [--rounds 10] [--steps 120]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import torch

from bench.gpu_check import Sink
from bench.tiny_steps import SIZES
from monitor_client import Monitor, MonitorSettings
from monitor_client._norm_worker import WayChooser

WAYS: dict[str, bool | None] = {"beside": True, "here": False, "chosen": None}


def _loop(sink: Sink, width: int, batch: int, way: bool | None
          ) -> tuple[Callable[[], None], Monitor]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
        torch.nn.ReLU(), torch.nn.Linear(width, width), torch.nn.ReLU(),
        torch.nn.Linear(width, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mon = Monitor(url=sink.url, run_id=f"ways-{width}-{way}", settings=MonitorSettings(
        install_hooks=False, spool_dir=tempfile.mkdtemp(prefix="offload-ways-")))
    mon.watch(model, opt)
    if way is not None:
        mon._models.entries[0].stats._offload.ways = WayChooser(fixed=way)
    x, y = torch.randn(batch, 32), torch.randn(batch, 1)
    n = 0

    def step() -> None:
        nonlocal n
        n += 1
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        mon.log_step(n, loss=loss, samples=batch)

    return step, mon


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--steps", type=int, default=120)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    sink = Sink()
    try:
        for size, (width, batch) in SIZES.items():
            loops = {name: _loop(sink, width, batch, way) for name, way in WAYS.items()}
            times: dict[str, list[float]] = {name: [] for name in loops}
            for r in range(args.rounds):
                for name in list(loops) if r % 2 else list(reversed(loops)):
                    step = loops[name][0]
                    for _ in range(5):
                        step()
                    spans = []
                    for _ in range(args.steps):
                        start = time.perf_counter()
                        step()
                        spans.append(time.perf_counter() - start)
                    times[name].append(statistics.median(spans))
            med = {name: statistics.median(v) for name, v in times.items()}
            print(f"{size} step: beside {med['beside'] * 1e6:.0f} us, here "
                  f"{med['here'] * 1e6:.0f} us ({med['here'] / med['beside']:.3f}x), chosen "
                  f"{med['chosen'] * 1e6:.0f} us ({med['chosen'] / med['beside']:.3f}x); "
                  f"{args.rounds} rounds x {args.steps} steps")
            for _, mon in loops.values():
                mon.close(timeout=5)
    finally:
        sink.close()


if __name__ == "__main__":
    main()
