"""The training job bench/heal.py runs under torchrun: DDP over gloo on CPU, a paced step,
a checkpoint every ``--ckpt-every`` steps, resumed where ``mon.resume_plan`` says (the
monitor's restart) else from its newest save, as docs/actions.md "Healing" writes it.

Each rank appends ``<wall time> <launch> <step>`` to ``<out>/steps-r<rank>.log`` after every
step, so the bench reads what was trained when, across restarts. A file ``<out>/stuck-<n>``
makes rank ``--stuck-rank`` block before its next step on launch ``n`` (a training thread
stuck in a kernel or a collective that never returns: the process lives, its watchdog
reports), until the process is ended.
"""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import monitor_client


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--ckpt-every", type=int, default=100)
    p.add_argument("--stuck-rank", type=int, default=1)
    p.add_argument("--collective-timeout", type=float, default=300.0)
    p.add_argument("--watchdog-floor", type=float, default=5.0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank = dist.get_rank()
    launch = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    ckpt_dir = args.out / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    xs = torch.randn(8192, 32)
    dataset = torch.utils.data.TensorDataset(xs, xs @ torch.randn(32, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    data = monitor_client.DataStream(
        torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler))
    model = DistributedDataParallel(torch.nn.Linear(32, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = monitor_client.Monitor(
        project="heal-bench", run_id=args.run_id,
        settings=monitor_client.MonitorSettings(watchdog_floor=args.watchdog_floor,
                                                gpu_probe=None, linger=0.2))
    mon.watch(model, opt)

    step = 0
    plan = mon.resume_plan(ckpt_dir)
    saved = sorted(ckpt_dir.glob("step-*.pt"), key=lambda f: int(f.stem[5:]))
    path = plan.checkpoint_path if plan is not None else (saved[-1] if saved else None)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        data.seek(state["position"], skip=plan.skip if plan is not None else ())
        mon.resumed_from(step, str(path))
    log = (args.out / f"steps-r{rank}.log").open("a", buffering=1)
    stuck = args.out / f"stuck-{launch}"
    while step < args.steps:
        for x, y in mon.timed(data):
            if rank == args.stuck_rank and stuck.exists():
                while True:
                    time.sleep(60)  # stuck: the others wait in DDP's all-reduce
            step += 1
            time.sleep(args.step_time)  # a real model's kernels
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.log_step(step, loss=loss, samples=len(x))
            log.write(f"{time.time():.3f} {launch} {step}\n")
            if step % args.ckpt_every == 0:
                if rank == 0:
                    where = ckpt_dir / f"step-{step}.pt"
                    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                                "step": step, "position": data.position}, where.with_suffix(".tmp"))
                    os.replace(where.with_suffix(".tmp"), where)
                    mon.checkpoint_saved(step, str(where))
                dist.barrier()
            if step >= args.steps:
                break
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()
