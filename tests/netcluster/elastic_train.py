"""A small elastic DDP job for the netcluster harness, instrumented as docs/client.md and
docs/actions.md say: ``monitor_client.Monitor``, ``watch``, ``timed(DataStream)``, a
checkpoint every ``--checkpoint-every`` steps reported with ``checkpoint_saved``, and on a
(re)start the checkpoint to resume from loaded and named with ``resumed_from``: the one
``mon.resume_plan`` names when the monitor restarted the job (its last clean checkpoint,
docs/actions.md "Healing"), else the newest saved.

Started by ``torchrun`` on each node (``RANK``, ``LOCAL_RANK``, ``GROUP_RANK``,
``TORCHELASTIC_RESTART_COUNT``, ``MASTER_ADDR`` from it), gloo on CPU. Each rank appends one
JSON line per event to ``<out>/ranks/node<N>.local<L>.jsonl``: ``start`` (rank, world,
attempt), ``resume`` (the checkpoint's step and weights' digest), ``step`` (loss, weights'
digest after the step, step seconds, the part spent loading its batch, the forward pass's
and the compute's: forward and backward up to the all-reduce, data position), ``checkpoint`` (rank 0: step, path,
digest), and at the end ``<out>/final/rank<R>.json`` (the final weights' digest), so a test
can check that every step after a restart follows the checkpoint it resumed from and that
every rank ends with the same weights.

Faults the node's ranks carry out themselves are read from ``$NETCLUSTER_FAULTS``
(netcluster/fault_files.py): a slowed loader, a NaN at a step, a bit flip in the gradients
at a step; the node's GPUs are the fake NVML (netcluster/fake_gpu) when
``NETCLUSTER_FAKE_GPU=1``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import struct
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset, default_collate

import monitor_client
from tests.netcluster.fault_files import Injected


def parse() -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--run-id", required=True)
    p.add_argument("--project", default="netcluster")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--checkpoint-every", type=int, default=10)
    p.add_argument("--checkpoint-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--width", type=int, default=64, help="hidden width: the CPU a step costs")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--step-time", type=float, default=0.0,
                   help="seconds each step sleeps besides its compute (a paced job)")
    p.add_argument("--collective-timeout", type=float, default=120.0,
                   help="gloo's timeout: how long a rank waits in a collective for a stuck one")
    p.add_argument("--watchdog-floor", type=float, default=60.0,
                   help="MonitorSettings.watchdog_floor: no hang is reported sooner")
    return p.parse_args()


class Log:
    """This rank's JSON-lines log (appended across restarts)."""

    def __init__(self, out: Path, node: int, local_rank: int) -> None:
        self.path = out / "ranks" / f"node{node}.local{local_rank}.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fh = self.path.open("a", buffering=1)
        self.base: dict[str, Any] = {}

    def __call__(self, event: str, **fields: Any) -> None:
        self.fh.write(json.dumps({"event": event, "time": time.time(), "pid": os.getpid(),
                                  **self.base, **fields}) + "\n")


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def flip_bit(model: torch.nn.Module, bit: int) -> None:
    """One bit of one gradient element, flipped in place: a silent error of this device."""
    grad = next(model.parameters()).grad
    assert grad is not None
    flat = grad.view(-1)
    (word,) = struct.unpack("<I", struct.pack("<f", float(flat[0])))
    (flat[0],) = struct.unpack("<f", struct.pack("<I", word ^ (1 << bit)))


def latest_checkpoint(directory: Path) -> str:
    found = sorted(directory.glob("ckpt-*.pt"))
    return str(found[-1]) if found else ""


def main() -> None:
    args = parse()
    env = os.environ
    node, local = int(env.get("NETCLUSTER_NODE", "0")), int(env["LOCAL_RANK"])
    attempt = int(env.get("TORCHELASTIC_RESTART_COUNT", "0"))
    torch.set_num_threads(1)
    log = Log(args.out, node, local)
    log("boot", attempt=attempt)
    dist.init_process_group("gloo", timeout=timedelta(seconds=args.collective_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    log.base = {"rank": rank, "world": world, "group_rank": int(env.get("GROUP_RANK", "0")),
                "attempt": attempt}
    log("start", master=env.get("MASTER_ADDR"), hostname=os.uname().nodename)
    injected = Injected(env.get("NETCLUSTER_FAULTS"), local, attempt)

    gen = torch.Generator().manual_seed(1234)  # the same data on every rank and attempt
    x_all = torch.randn(args.samples, args.width, generator=gen)
    w_true = torch.randn(args.width, 1, generator=gen) / args.width**0.5  # targets of unit scale
    y_all = x_all @ w_true + 0.1 * torch.randn(
        args.samples, 1, generator=gen)

    def collate(batch: list[Any]) -> Any:
        delay = injected.loader_delay()  # a slow loader: the time is the loader's
        if delay > 0:
            time.sleep(delay)
        return default_collate(batch)

    sampler = DistributedSampler(TensorDataset(x_all, y_all), num_replicas=world, rank=rank,
                                 shuffle=True, seed=0)
    loader = DataLoader(TensorDataset(x_all, y_all), batch_size=args.batch, sampler=sampler,
                        collate_fn=collate, drop_last=True)
    data = monitor_client.DataStream(loader)

    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    settings = monitor_client.MonitorSettings(watchdog_floor=args.watchdog_floor)
    if env.get("NETCLUSTER_FAKE_GPU") == "1":
        from monitor_client._nvml import nvml_probe  # the client's NVML code, fake pynvml

        settings = monitor_client.MonitorSettings(gpu_probe=nvml_probe(local),
                                                  watchdog_floor=args.watchdog_floor)
    mon = monitor_client.Monitor(project=args.project, run_id=args.run_id,
                                 config={"lr": 0.01, "batch_size": args.batch,
                                         "width": args.width},
                                 total_steps=args.steps, settings=settings)

    step = 0
    args.checkpoint_dir.mkdir(parents=True, exist_ok=True)
    plan = mon.resume_plan(args.checkpoint_dir)  # the monitor's restart: every rank alike
    chosen = [latest_checkpoint(args.checkpoint_dir) if rank == 0 else ""]
    dist.broadcast_object_list(chosen, src=0)  # every rank resumes from the same one
    if plan is not None:
        chosen = [plan.checkpoint_path]
    if chosen[0]:
        state = torch.load(chosen[0], weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        step = int(state["step"])
        data.seek(int(state["position"]), skip=plan.skip if plan is not None else ())
        mon.resumed_from(step, chosen[0])
        log("resume", step=step, path=chosen[0], digest=digest(model),
            saved_digest=state["digest"], position=int(state["position"]),
            plan=plan.id if plan is not None else None)

    ddp = DistributedDataParallel(model)
    mon.watch(ddp, optimizer)
    # The first layer's weight gradient is the last one backward computes, and DDP's
    # all-reduce of the (single) bucket waits for it: up to here a step is compute alone.
    grads_ready = [0.0]
    model[0].weight.register_hook(lambda g: grads_ready.__setitem__(0, time.monotonic()))
    last = time.monotonic()
    while step < args.steps:
        for x, y in mon.timed(data):
            step += 1
            loaded = time.monotonic()  # since the previous step ended: this batch's loading
            loss = (ddp(x) - y).pow(2).mean()
            forward = time.monotonic() - loaded  # compute alone: no collective in a forward
            if injected.due("nan", step):
                loss = loss * float("nan")
            loss.backward()  # DDP all-reduces the gradients here
            flip = injected.due("bitflip", step)
            if flip:
                flip_bit(model, int(flip.get("bit", 25)))
            optimizer.step()
            mon.log_step(step, loss=loss, samples=args.batch)
            optimizer.zero_grad()
            if args.step_time:
                time.sleep(args.step_time)
            now = time.monotonic()
            log("step", step=step, loss=float(loss.detach()), digest=digest(model),
                position=data.position, seconds=now - last, data_seconds=loaded - last,
                forward_seconds=forward, compute_seconds=grads_ready[0] - loaded)
            if step % args.checkpoint_every == 0 and rank == 0:
                path = args.checkpoint_dir / f"ckpt-{step:08d}.pt"
                tmp = path.with_suffix(".tmp")
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "step": step, "position": data.position,
                            "digest": digest(model)}, tmp)
                os.replace(tmp, path)  # whole or absent, whenever a kill lands
                mon.checkpoint_saved(step, path)
                log("checkpoint", step=step, path=str(path), digest=digest(model))
            last = time.monotonic()
            if step >= args.steps:
                break

    final = args.out / "final" / f"rank{rank}.json"
    final.parent.mkdir(parents=True, exist_ok=True)
    final.write_text(json.dumps({"rank": rank, "node": node, "local_rank": local,
                                 "step": step, "digest": digest(model), "world": world,
                                 "attempt": attempt}))
    log("end", step=step, digest=digest(model))
    mon.close()
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # gloo's teardown can linger on a loaded machine; everything is flushed


if __name__ == "__main__":
    main()
