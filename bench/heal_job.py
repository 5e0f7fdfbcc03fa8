"""The training job bench/heal.py runs under torchrun: DDP over gloo on CPU, a paced step,
a checkpoint every ``--ckpt-every`` steps, resumed where ``mon.resume_plan`` says (the
monitor's restart) else from its newest save, as docs/actions.md "Healing" writes it.

Each rank appends ``<wall time> <launch> <step>`` to ``<out>/steps-r<rank>.log`` after every
step, so the bench reads what was trained when, across restarts; and ``<launch> <phase>
<wall time> [<value>]`` to ``<out>/phases-r<rank>.log`` as it starts (``proc``: the process
started, from /proc; ``imported``: torch and the client imported; ``joined``: the process
group formed; ``built``: the data and the DDP model built; ``ready``: the monitor
started and watching; ``planned``: the resume plan asked; ``loaded``: the checkpoint loaded, its
step the value), so the bench says where a relaunch's time goes. Rank 0 appends each
checkpoint's cost (the save and the barrier after it, seconds) to ``<out>/ckpt-cost.log``. A file ``<out>/stuck-<n>``
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
    imported = time.time()

    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank = dist.get_rank()
    launch = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    phases = (args.out / f"phases-r{rank}.log").open("a", buffering=1)
    phases.write(f"{launch} proc {_started():.3f}\n{launch} imported {imported:.3f}\n"
                 f"{launch} joined {time.time():.3f}\n")
    ckpt_dir = args.out / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    xs = torch.randn(8192, 32)
    dataset = torch.utils.data.TensorDataset(xs, xs @ torch.randn(32, 1))
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    data = monitor_client.DataStream(
        torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler))
    model = DistributedDataParallel(torch.nn.Linear(32, 1))
    phases.write(f"{launch} built {time.time():.3f}\n")
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    mon = monitor_client.Monitor(
        project="heal-bench", run_id=args.run_id,
        settings=monitor_client.MonitorSettings(watchdog_floor=args.watchdog_floor,
                                                gpu_probe=None, linger=0.2))
    mon.watch(model, opt)
    phases.write(f"{launch} ready {time.time():.3f}\n")

    step = 0
    plan = mon.resume_plan(ckpt_dir)
    phases.write(f"{launch} planned {time.time():.3f}\n")
    saved = sorted(ckpt_dir.glob("step-*.pt"), key=lambda f: int(f.stem[5:]))
    path = plan.checkpoint_path if plan is not None else (saved[-1] if saved else None)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        data.seek(state["position"], skip=plan.skip if plan is not None else ())
        mon.resumed_from(step, str(path))
    phases.write(f"{launch} loaded {time.time():.3f} {step}\n")
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
                began = time.time()
                if rank == 0:
                    where = ckpt_dir / f"step-{step}.pt"
                    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                                "step": step, "position": data.position}, where.with_suffix(".tmp"))
                    os.replace(where.with_suffix(".tmp"), where)
                    mon.checkpoint_saved(step, str(where))
                dist.barrier()
                if rank == 0:
                    with (args.out / "ckpt-cost.log").open("a") as cost:
                        cost.write(f"{time.time() - began:.6f}\n")
            if step >= args.steps:
                break
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


def _started() -> float:
    """This process's start (wall time), from /proc: its start in clock ticks after boot
    and the boot's time; now where /proc does not say."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, ValueError, IndexError, StopIteration):
        return time.time()
    return boot + ticks / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    main()
