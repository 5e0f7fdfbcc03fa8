"""A user-style 4-rank gloo training script for the hang end-to-end tests.

    python hang_user_train.py RANK WORLD PORT URL RUN_ID MODE WORKDIR
    torchrun ... hang_user_train.py URL RUN_ID MODE WORKDIR   # rank, world from torchrun

MODE ``block``: rank 2 (``block:R``: rank R), at step 8, waits in ``wait_for_release()``
before its all_reduce until WORKDIR/release exists (the others wait for it inside
all_reduce), then all go on to step 12. MODE ``kill``: rank 3, at step 8, is SIGKILLed
before its all_reduce. Gloo's TCP pairs notice a dead peer and raise, unlike NCCL, which
waits; so that its peers stay blocked in all_reduce as on a GPU cluster, rank 3 first forks
a child that only holds its sockets open (the test kills the whole session at the end).
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import monitor_client
from monitor_client.settings import MonitorSettings

if len(sys.argv) == 5:  # under torchrun: RANK, WORLD_SIZE, MASTER_ADDR/PORT in the env
    rank, world, port = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), None
    url, run_id, mode, workdir = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4])
else:
    rank, world, port = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    url, run_id, mode, workdir = sys.argv[4], sys.argv[5], sys.argv[6], Path(sys.argv[7])
mode, _, blocked = mode.partition(":")
blocked_rank = int(blocked or 2)


def wait_for_release() -> None:
    while not (workdir / "release").exists():
        time.sleep(0.1)  # the test's go-ahead (a file): the test's timeout bounds it


def die_keeping_sockets_open() -> None:
    if os.fork() == 0:  # the child holds the inherited sockets; nothing else
        while True:
            time.sleep(3600)  # a child that only holds the sockets
    os.kill(os.getpid(), signal.SIGKILL)


dist.init_process_group("gloo", init_method=None if port is None else f"tcp://127.0.0.1:{port}",
                        rank=rank, world_size=world, timeout=datetime.timedelta(seconds=600))
torch.manual_seed(rank)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
mon = monitor_client.Monitor(url=url, project="hang", run_id=run_id, settings=MonitorSettings(
    linger=0.05, watchdog_floor=3.0, gpu_probe=None))
mon.watch(model, optimizer)
for step in range(1, 13):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
    loss.backward()
    if step == 8 and rank == blocked_rank and mode == "block":
        wait_for_release()
    if step == 8 and rank == 3 and mode == "kill":
        die_keeping_sockets_open()
    for p in model.parameters():
        dist.all_reduce(p.grad)
    optimizer.step()
    optimizer.zero_grad()
    mon.log_step(step, loss=loss, samples=16)
    (workdir / f"rank{rank}.step").write_text(str(step))
mon.close()
dist.destroy_process_group()
