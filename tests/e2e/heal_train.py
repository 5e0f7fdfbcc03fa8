"""A user's torchrun training script that the monitor heals, written from docs/actions.md,
"Healing": it counts its data with ``monitor_client.DataStream``, saves and reports
checkpoints, and at start asks ``mon.resume_plan(ckpt_dir)`` where a restart the monitor
decided resumes it (else it resumes from its own newest save, as it would without the
monitor). The monitoring is the lines marked ``# monitor``; the rest is the user's.

DDP over gloo, one process per rank as ``torchrun --nnodes=MIN:MAX --max-restarts=N`` starts
it (or ``srun``, one task per node, requeued by its batch script). Faults, injected on the
job's first launch only (``TORCHELASTIC_RESTART_COUNT``, or ``SLURM_RESTART_COUNT``, 0), at
step ``--fault-step`` on rank ``--fault-rank``: ``hang`` (the rank sleeps before its
forward: the others wait in the all-reduce), ``stop`` (the rank SIGSTOPs itself: frozen,
no hang report), ``kill`` (SIGKILL), ``xid`` (its GPU probe reports XID 79, NVML's "fallen
off the bus"; the rank trains on, as a fake GPU can), ``nan`` (a NaN in its input, on
every launch where ``--nan-host`` is this host, at steps ``--nan-steps``).

Each rank appends every step it trains to ``<out>/steps-r<rank>.log`` as ``<launch> <step>
<position>`` and the resume point of each launch as ``resume <launch> <step> <position>
<how>``; at the end it writes ``<out>/weights-r<rank>.txt`` (a digest of its weights: one
job, one model) and exits 0.

    torchrun --nnodes=1 --nproc-per-node=2 --max-restarts=2 heal_train.py \\
        --url URL --run-id R --out OUT --steps 40 --fault hang --fault-rank 1 --fault-step 20
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import socket
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import monitor_client  # monitor


class FakeGpu:
    """The GPU probe the NVML reader stands in for (client/monitor_client/_nvml.py): healthy
    until ``bad`` exists, then XID 79."""

    def __init__(self, bad: Path) -> None:
        self.bad = bad

    def read(self) -> dict[str, float]:
        if self.bad.exists():
            return {"xid_last": 79.0, "xid_count": 1.0}
        return {"xid_count": 0.0}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--url", required=True)
    p.add_argument("--run-id", required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--ckpt-every", type=int, default=5)
    p.add_argument("--step-time", type=float, default=0.05)
    p.add_argument("--fault", default="")
    p.add_argument("--fault-rank", type=int, default=-1)
    p.add_argument("--fault-step", type=int, default=-1)
    p.add_argument("--nan-host", default="")
    p.add_argument("--nan-steps", default="")
    p.add_argument("--watchdog-floor", type=float, default=2.0)
    args = p.parse_args()

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    launch = int(os.environ.get("TORCHELASTIC_RESTART_COUNT")  # torchrun's restarts,
                 or os.environ.get("SLURM_RESTART_COUNT") or 0)  # or Slurm's requeues
    first = launch == 0
    host = socket.gethostname()
    ckpt_dir = args.out / "ckpt"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    xid = args.out / f"xid-r{rank}-{launch}"  # this rank's GPU on this launch only

    torch.manual_seed(0)
    target = torch.randn(8, 1)
    xs = torch.randn(4096, 8)
    dataset = torch.utils.data.TensorDataset(xs, xs @ target)
    sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=False)
    data = monitor_client.DataStream(  # monitor
        torch.utils.data.DataLoader(dataset, batch_size=16, sampler=sampler))
    model = DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    mon = monitor_client.Monitor(  # monitor
        url=args.url, project="heal", run_id=args.run_id, total_steps=args.steps,
        settings=monitor_client.MonitorSettings(
            watchdog_floor=args.watchdog_floor, linger=0.1,
            gpu_probe=FakeGpu(xid) if args.fault == "xid" else None))
    mon.watch(model, opt)  # monitor

    step, how = 0, "start"
    plan = mon.resume_plan(ckpt_dir)  # monitor: where the monitor's restart resumes the job
    saved = sorted(ckpt_dir.glob("step-*.pt"), key=lambda f: int(f.stem[5:]))
    path = plan.checkpoint_path if plan is not None else (saved[-1] if saved else None)
    if path is not None:
        state = torch.load(path, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = state["step"]
        data.seek(state["position"], skip=plan.skip if plan is not None else ())
        mon.resumed_from(step, str(path))  # monitor
        how = "plan" if plan is not None else "newest"
    log = (args.out / f"steps-r{rank}.log").open("a")
    log.write(f"resume {launch} {step} {data.position} {how}\n")
    log.flush()

    nan_steps = {int(s) for s in args.nan_steps.split(",") if s}
    for x, y in mon.timed(data):  # monitor: timed() sends each step's data position
        if step >= args.steps:
            break
        step += 1
        faulty = first and rank == args.fault_rank and step == args.fault_step
        if faulty and args.fault == "hang":
            time.sleep(3600)  # stuck: the others wait in DDP's all-reduce
        if faulty and args.fault in ("stop", "kill"):
            os.kill(os.getpid(), signal.SIGSTOP if args.fault == "stop" else signal.SIGKILL)
        if faulty and args.fault == "xid":
            xid.write_text("79")
        if host == args.nan_host and step in nan_steps and rank == args.fault_rank:
            x = x.clone()
            x[0, 0] = float("nan")
        time.sleep(args.step_time)  # a real model's kernels
        loss = (model(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        mon.log_step(step, loss=loss, samples=len(x))  # monitor
        log.write(f"{launch} {step} {data.position}\n")
        log.flush()
        if step % args.ckpt_every == 0 and rank == 0:
            where = ckpt_dir / f"step-{step}.pt"
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "step": step, "position": data.position}, where)
            mon.checkpoint_saved(step, str(where))  # monitor
        if step % args.ckpt_every == 0:
            dist.barrier()
    digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                     for p in model.module.parameters())).hexdigest()
    (args.out / f"weights-r{rank}.txt").write_text(f"{step} {digest}\n")
    mon.close()  # monitor
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
