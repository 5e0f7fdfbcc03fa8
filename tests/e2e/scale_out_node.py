"""One "node" of a multi-node data-parallel job: ``ranks`` ranks, each a tiny real model with
its own ``monitor_client.Monitor`` pushing to this node's sidecar, and the nodes kept in
lockstep by a torch.distributed (gloo, CPU) all-reduce every step, as DDP's gradient
all-reduce keeps real nodes in lockstep.

One process per node, not per rank: 16 torch processes do not fit the 2-core CI machine.
The ranks of a node run one after the other inside the step; each Monitor has its own rank,
sender thread and spool, so the sidecar sees exactly what 4 rank processes would send.

There is no GPU: each rank's "kernel time" is a sleep of ``--compute`` seconds after its
real forward/backward/optimizer step, so compute times are steady on a loaded machine. The
rank named by ``--slow-rank`` computes ``--slow-factor`` times longer once the file
``<control>/slow`` exists (a throttled GPU). Freeze this process (SIGSTOP) and every other
node blocks in the all-reduce: a hung node stalls the whole run.

    python tests/e2e/scale_out_node.py --node 0 --nodes 4 --ranks 4 --sidecar URL \
        --master-port P --run-id R --project P --control DIR
"""

from __future__ import annotations

import argparse
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from monitor_client import Monitor, MonitorSettings


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name in ("node", "nodes", "ranks", "master-port", "slow-rank"):
        p.add_argument(f"--{name}", type=int, default=-1)
    for name in ("sidecar", "run-id", "project", "control", "token"):
        p.add_argument(f"--{name}", default="")
    p.add_argument("--compute", type=float, default=0.03)
    p.add_argument("--slow-factor", type=float, default=3.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    torch.set_num_threads(1)
    torch.manual_seed(args.node)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.master_port}",
                            rank=args.node, world_size=args.nodes,
                            timeout=timedelta(minutes=10))
    control = Path(args.control)
    world = args.nodes * args.ranks
    ranks = [args.node * args.ranks + i for i in range(args.ranks)]
    models = [torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                  torch.nn.Linear(32, 1)) for _ in ranks]
    opts = [torch.optim.SGD(m.parameters(), lr=0.01) for m in models]
    mons = [Monitor(args.sidecar, args.project, run_id=args.run_id, token=args.token or None,
                    settings=MonitorSettings(rank=r, world_size=world,
                                             spool_dir=control / f"spool{args.node}",
                                             install_hooks=False, gpu_probe=None)) for r in ranks]
    for mon, model, opt in zip(mons, models, opts, strict=True):
        mon.watch(model, opt, grad_clip=1.0)
    sync = torch.zeros(1)
    step = 0
    while True:
        step += 1
        losses, computes = [], []
        for rank, model, opt in zip(ranks, models, opts, strict=True):
            start = time.perf_counter()
            x = torch.randn(32, 16)
            loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            slow = rank == args.slow_rank and (control / "slow").exists()
            # a step's compute, the slow rank's longer
            time.sleep(args.compute * (args.slow_factor if slow else 1.0))
            losses.append(loss.detach())
            computes.append(time.perf_counter() - start)
        start = time.perf_counter()
        dist.all_reduce(sync)  # the gradient all-reduce: every node waits for the slowest
        waited = time.perf_counter() - start
        for mon, loss, compute in zip(mons, losses, computes, strict=True):
            mon.log_step(step, loss=loss, tokens=32, compute_time=compute,
                         sync_wait_time=waited)


if __name__ == "__main__":
    main()
