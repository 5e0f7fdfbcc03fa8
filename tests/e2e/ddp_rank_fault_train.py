"""A user's DDP training script, one process per rank as torchrun starts it (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``/``MASTER_PORT`` in the environment, gloo on CPU), with one
rank's data going bad: ``--nan-rank R --nan-step S`` puts a NaN into rank R's input batch
at step S; ``--corrupt-rank R --corrupt-from S --corrupt-scale K`` multiplies rank R's
labels by K from step S on (a corrupt shard: wrong, but finite); ``--corrupt-shuffle``
shuffles them within the batch instead (a shard whose labels lost their samples) and
``--corrupt-steps N`` ends the corruption after N steps.

Under ``torchrun`` on several nodes, ``--pause-file F --pause-at S`` holds every rank before
step S until F exists, and ``--hold-file F`` before ``mon.close()`` (a test acts on the
job's sidecars while it is in a known place: kills one, restarts it).

The model is a small MLP regressing a fixed linear target; each rank draws its own batches
(its shard). ``monitor_client.Monitor`` is used as the README shows; the node name comes
from ``NODE_NAME``, as Kubernetes sets it.

    RANK=0 WORLD_SIZE=4 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 NODE_NAME=gpu-node-0 \\
        python tests/e2e/ddp_rank_fault_train.py --url URL --run-id R --steps 60
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import monitor_client


def _wait_for(path: Path) -> None:
    while not path.exists():
        time.sleep(0.05)  # the test's go-ahead (a file): its timeout bounds it


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--steps", type=int, default=60)
    for name in ("nan-rank", "nan-step", "corrupt-rank", "corrupt-from", "corrupt-steps",
                 "pause-at"):
        p.add_argument(f"--{name}", type=int, default=-1)
    p.add_argument("--corrupt-scale", type=float, default=1.0)
    p.add_argument("--corrupt-shuffle", action="store_true")
    p.add_argument("--step-time", type=float, default=0.0,
                   help="seconds of each step's compute at least (a real model's kernels; "
                   "this one's take a millisecond, a scheduler's hiccup on a loaded machine)")
    p.add_argument("--pause-file", type=Path)
    p.add_argument("--hold-file", type=Path)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(args.seed)  # the same initial weights on every rank, as DDP's broadcast
    target = torch.randn(16, 1)
    model = DistributedDataParallel(torch.nn.Sequential(
        torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    data = torch.Generator().manual_seed(1000 * (args.seed + 1) + rank)  # this rank's shard

    mon = monitor_client.Monitor(url=args.url, project="ddp-faults", run_id=args.run_id,
                                 total_steps=args.steps)
    mon.watch(model, optimizer)
    for step in range(1, args.steps + 1):
        x = torch.randn(64, 16, generator=data)
        y = x @ target + 0.1 * torch.randn(64, 1, generator=data)
        if rank == args.nan_rank and step == args.nan_step:
            x[0, 0] = float("nan")
        if step == args.pause_at and args.pause_file is not None:
            _wait_for(args.pause_file)
        if rank == args.corrupt_rank and step >= args.corrupt_from and (
                args.corrupt_steps < 0 or step < args.corrupt_from + args.corrupt_steps):
            y = y[torch.randperm(len(y), generator=data)] if args.corrupt_shuffle \
                else y * args.corrupt_scale
        if args.step_time:
            time.sleep(args.step_time)  # a step's compute
        loss = (model(x) - y).pow(2).mean()
        loss.backward()  # DDP all-reduces the gradients here
        optimizer.step()
        optimizer.zero_grad()
        mon.log_step(step, loss=loss, samples=64)
    if args.hold_file is not None:
        _wait_for(args.hold_file)
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # gloo's teardown can linger on a loaded machine; everything is flushed


if __name__ == "__main__":
    main()
