"""A user's plain CPU training loop written from the README, with faults of known cost that
the script injects itself, for tests/e2e/test_goodput_faults.py. The monitoring is the lines marked
``# monitor``; everything else is the user's.

A small MLP regresses a fixed linear target. Each step's compute takes ``--step-time`` s at
least (a sleep: a real model's kernels; this one's take a millisecond). The faults, each off
unless asked for:

- ``--slow-batches 20,40 --loader-sleep 0.3``: the dataset takes that long to read the first
  sample of those batches (a slow disk), inside the loader ``mon.timed`` wraps;
- ``--load-time 0.1``: every batch takes that long to load (remote storage, heavy decoding),
  from batch ``--load-from`` on (default 1), on rank ``--load-rank`` only (default: every
  rank); with ``--workers N`` the ``DataLoader`` loads in N worker processes, which prefetch
  (N=0, the default: in the training process, no prefetch);
- ``--eval-at 50,100 --eval-sleep 0.5``: an evaluation after those steps that takes that
  long (a validation set), then ``mon.log_eval``;
- ``--ckpt-at 60,120 --ckpt-sleep 0.5``: a checkpoint after those steps, written to
  ``--out-dir``, whose storage takes that long more, then ``mon.checkpoint_saved``;
- ``--hang-at 90 --hang 3``: step 90 is stuck that long (a collective that does not return,
  until it does), past the watchdog's limit (``--watchdog-floor``);
- ``--crash-at 150``: after step 150 the process dies with an exception (the Monitor ends
  the run ``failed``); ``--resume PATH`` relaunches from a checkpoint: the loop goes on at
  its step + 1, the data where it left it (``DataStream.seek``);
- with ``WORLD_SIZE`` > 1 (``RANK``, ``MASTER_ADDR``/``PORT``: ``torchrun`` sets them) it
  runs DDP over gloo, and ``--slow-rank 1 --slow 0.02`` makes that rank's compute slower by
  that much every step (a slow GPU): the others wait for it in the all-reduce.

The script keeps its own clock too, for the test to compare with: ``<out-dir>/clock-r<rank>
-<pid>.jsonl`` has one line per event, ``{"event", "step", "time"}`` (Unix time):
``up`` (once the monitor watches the model: the run record), ``step`` (each ``log_step``
returned, with ``wait``: the seconds the loop waited for that step's batch, perf_counter from
the previous step's end to the batch in hand, ``slept``: its compute's sleep as it
really lasted, and ``lap``: perf_counter from the previous ``backward()``'s return to this
one's call, everything the rank did between two gradient all-reduces, which every rank
leaves together), ``eval`` / ``ckpt`` with their ``seconds``
(perf_counter around them), ``crash``.

    python goodput_train.py --url URL --run-id R --steps 200 --out-dir out
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist

import monitor_client  # monitor

BATCH = 16


def _steps(text: str) -> set[int]:
    return {int(s) for s in text.split(",") if s}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=None, help="else MONITOR_AGENT_URL (one sidecar a node)")
    p.add_argument("--project", default="goodput")
    p.add_argument("--run-id", required=True)
    p.add_argument("--out-dir", required=True)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--step-time", type=float, default=0.025)
    p.add_argument("--slow-batches", default="")
    p.add_argument("--loader-sleep", type=float, default=0.0)
    p.add_argument("--eval-at", default="")
    p.add_argument("--eval-sleep", type=float, default=0.0)
    p.add_argument("--ckpt-at", default="")
    p.add_argument("--ckpt-sleep", type=float, default=0.0)
    p.add_argument("--hang-at", type=int, default=0)
    p.add_argument("--hang", type=float, default=0.0)
    p.add_argument("--crash-at", type=int, default=0)
    p.add_argument("--resume", default="")
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow", type=float, default=0.0)
    p.add_argument("--watchdog-floor", type=float, default=60.0)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--load-time", type=float, default=0.0)
    p.add_argument("--load-from", type=int, default=1)
    p.add_argument("--load-rank", type=int, default=-1)
    args = p.parse_args()
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
    os.makedirs(args.out_dir, exist_ok=True)
    clock = open(os.path.join(args.out_dir, f"clock-r{rank}-{os.getpid()}.jsonl"), "w")  # noqa: SIM115

    def note(event: str, step: int, **more: float) -> None:
        print(json.dumps({"event": event, "step": step, "time": time.time(), **more}),
              file=clock, flush=True)

    slow_batches, evals, ckpts = (_steps(args.slow_batches), _steps(args.eval_at),
                                  _steps(args.ckpt_at))
    torch.manual_seed(0)
    torch.set_num_threads(1)
    target = torch.randn(32, 1)

    class Samples(torch.utils.data.Dataset):
        """Sample ``i`` is the same on every run; the first of a slow batch reads slowly."""

        def __init__(self) -> None:
            n = BATCH * world * (args.steps + 10)
            self.x = torch.randn(n, 32, generator=torch.Generator().manual_seed(1))
            self.y = self.x @ target

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            batch = i // (BATCH * world) + 1
            if i % (BATCH * world) == 0 and batch in slow_batches:
                time.sleep(args.loader_sleep)  # the loader time the ledger must book
            first = (i - rank) % (BATCH * world) == 0  # this rank's batch's first sample
            if first and batch >= args.load_from and args.load_rank in (-1, rank):
                time.sleep(args.load_time)  # every batch's slow read
            return self.x[i], self.y[i]

    data = Samples()
    sampler = (torch.utils.data.DistributedSampler(data, shuffle=False) if world > 1
               else None)
    loader = torch.utils.data.DataLoader(data, batch_size=BATCH, sampler=sampler,
                                         num_workers=args.workers,
                                         persistent_workers=args.workers > 0)
    stream = monitor_client.DataStream(loader)  # monitor: counts batches by position
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 1))
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    held_out = torch.randn(64, 32, generator=torch.Generator().manual_seed(-1))
    settings = monitor_client.MonitorSettings(  # monitor
        linger=0.05, gpu_probe=None, watchdog_floor=args.watchdog_floor)  # monitor
    mon = monitor_client.Monitor(url=args.url, project=args.project, run_id=args.run_id,  # monitor
                                 total_steps=args.steps, settings=settings)  # monitor
    mon.watch(model, optimizer)  # monitor
    note("up", 0)
    first = 1
    if args.resume:
        state = torch.load(args.resume, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"] + 1
        stream.seek(state["position"])

    def evaluate() -> float:
        with torch.no_grad():
            loss = (model(held_out) - held_out @ target).pow(2).mean().item()
        time.sleep(args.eval_sleep)  # the rest of a validation set
        return loss

    step = first
    asked = time.perf_counter()
    synced = asked  # the previous backward()'s return: its all-reduce done on every rank
    for x, y in mon.timed(stream):  # monitor: data_time and data_position with each step
        wait = time.perf_counter() - asked
        # a step's compute, the slow rank's longer
        began = time.perf_counter()
        time.sleep(args.step_time + (args.slow if rank == args.slow_rank else 0.0))
        slept = time.perf_counter() - began
        loss = (model(x) - y).pow(2).mean()
        lap = time.perf_counter() - synced
        loss.backward()
        synced = time.perf_counter()
        if step == args.hang_at:
            time.sleep(args.hang)  # stuck, until it is not
        optimizer.step()
        optimizer.zero_grad()
        mon.log_step(step, loss=loss.detach(), samples=len(x))  # monitor
        note("step", step, wait=wait, slept=slept, lap=lap)
        if step in evals:
            began = time.perf_counter()
            val = evaluate()
            took = time.perf_counter() - began
            mon.log_eval(step, val_loss=val)  # monitor: right after the evaluation
            note("eval", step, seconds=took)
        if step in ckpts and rank == 0:
            began = time.perf_counter()
            path = os.path.join(args.out_dir, f"ckpt-{step}.pt")
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "step": step, "position": stream.position}, path)
            time.sleep(args.ckpt_sleep)  # slow storage
            took = time.perf_counter() - began
            mon.checkpoint_saved(step, path)  # monitor: right after the save
            note("ckpt", step, seconds=took)
        if step == args.crash_at:
            note("crash", step)
            raise RuntimeError(f"node lost after step {step}")
        if step >= args.steps:
            break
        step += 1
        asked = time.perf_counter()
    mon.close()  # monitor
    if world > 1:
        dist.destroy_process_group()
    print("done", step, flush=True)


if __name__ == "__main__":
    main()
