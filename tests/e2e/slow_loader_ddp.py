"""A user's DDP training script whose data loader is slow on some ranks (issue 23, item 3).

Launched as users launch it, one process per rank on loopback with gloo::

    python -m torch.distributed.run --nproc-per-node 4 tests/e2e/slow_loader_ddp.py \
        --url URL --run-id R --slow-ranks 2 --delay 0.12

A small MLP wrapped in ``DistributedDataParallel``, a ``DataLoader`` over a map-style
dataset, the monitor as the README shows it (``mon.timed(loader)`` for the data wait).
The dataset of each rank listed in ``--slow-ranks`` (``all``: every rank) sleeps in
``__getitem__`` so that one batch takes ``--delay`` seconds to load: a slow disk, an
expensive decode or a shard of bigger samples on that host.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import monitor_client

BATCH = 16


class Samples(Dataset):
    """Random regression samples; ``delay`` seconds of loading per batch when slow."""

    def __init__(self, n: int, seed: int, delay: float) -> None:
        gen = torch.Generator().manual_seed(seed)
        self.x = torch.randn(n, 32, generator=gen)
        self.per_sample = delay / BATCH

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.per_sample:
            time.sleep(self.per_sample)  # the slow loader under test
        return self.x[i]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--slow-ranks", default="", help="comma-separated ranks, or 'all'")
    p.add_argument("--delay", type=float, default=0.12)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--spool-dir", default=None)
    p.add_argument("--step-time", type=float, default=0.0, help="seconds of each step's "
                   "compute at least (a real model's kernels; this one's take a millisecond, "
                   "a scheduler's hiccup on a loaded machine)")
    args = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(minutes=5))
    rank = dist.get_rank()
    slow = args.slow_ranks == "all" or str(rank) in args.slow_ranks.split(",")
    torch.manual_seed(0)  # the same initial weights on every rank, as DDP expects
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = Samples(BATCH * args.steps, seed=rank, delay=args.delay if slow else 0.0)
    loader = DataLoader(data, batch_size=BATCH, shuffle=False)
    settings = monitor_client.MonitorSettings(spool_dir=args.spool_dir, gpu_probe=None)
    mon = monitor_client.Monitor(args.url, project="slowrank", run_id=args.run_id,
                                 total_steps=args.steps, settings=settings)
    mon.watch(model, optimizer, grad_clip=1.0)
    for step, x in enumerate(mon.timed(loader), 1):
        if args.step_time:
            time.sleep(args.step_time)  # a step's compute
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mon.log_step(step, loss=loss, samples=BATCH)
    mon.close()
    dist.destroy_process_group()
    if rank == 0:
        print(f"done: {args.steps} steps on {os.environ.get('WORLD_SIZE')} ranks")


if __name__ == "__main__":
    main()
