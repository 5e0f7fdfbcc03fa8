"""A user's plain training loop that closes the loop with the monitor, written from
docs/actions.md, "Closing the loop": it counts its data with ``monitor_client.DataStream``, reports
its checkpoints, and when the sidecar decides a rollback it reloads the checkpoint, resumes
the data where that checkpoint left it and leaves the plan's windows out, scales the LR
with the plan's factor through its torch scheduler, and honours a stop. The monitoring is
the lines marked ``# monitor``; everything else is the user's.

Its data is a dataset of numbered samples read in order (``DistributedSampler`` shards it
when ``WORLD_SIZE`` > 1, so batch position ``p`` of every rank holds samples of global
batch ``p``). Two corrupt stretches, batches ``poison`` (e.g. ``65-70,95-100``), have
targets off by growing powers of ten: the loss and gradients run away from the first of
them on (a divergence at a known batch). Every batch trained is written to
``<out_dir>/batches-r<rank>.log`` as ``<step> <position> <first sample id>`` and each
rollback as ``rollback <id> <checkpoint_step> <skip_to> <windows>``, so a test can check what was
consumed. ``--ignore_window`` is the mistake the sidecar must catch: the loop resumes the
data at the checkpoint and skips nothing. With ``WORLD_SIZE`` > 1 it runs DDP over gloo
(``RANK``, ``MASTER_ADDR``/``PORT``: ``torchrun`` sets them), rank 0 saves the checkpoints
and, by default, reports them alone (``--save_on=all``: every rank reports the same file once
it is saved); ``--poison_ranks=2,3`` corrupts only those ranks' shards (``--poison_from`` and
``--poison_len`` give one stretch). At the end each rank writes a digest of its weights to
``<out_dir>/weights-r<rank>.txt`` (one job, one model: they must all be equal).
``--pause_at=S --pause_file=F`` holds every rank before step S until F exists and
``--hold_file=F`` before ``mon.close()``, for a test that acts on the sidecars meanwhile.

    python rollback_user_train.py --url=http://127.0.0.1:9400 --run_id=demo --out_dir=out
"""

import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

import monitor_client  # monitor

url = "http://127.0.0.1:9400"
run_id = "rollback-demo"
out_dir = "out"
steps = 200
ckpt_every = 10
poison = "65-70,95-100"
poison_from, poison_len = 0, 0  # one stretch, instead of ``poison``
batch_size = 16
ignore_window = 0
step_delay = 0.05  # a real model's step takes this long at least; this one is tiny
save_on = "rank0"  # or "all"
poison_ranks = ""  # e.g. "2,3"; empty: every rank's shard
pause_at, pause_file, hold_file = 0, "", ""
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=", 1)
    globals()[key] = type(globals()[key])(val)
if poison_len:
    poison = f"{poison_from}-{poison_from + poison_len - 1}"

rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def wait_for(path):
    while path and not os.path.exists(path):
        time.sleep(0.05)  # the test's go-ahead (a file): its timeout bounds it

if world > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world)
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)
torch.set_num_threads(1)
W_TRUE = torch.randn(8, 1)
CORRUPT = [tuple(map(int, s.split("-"))) for s in poison.split(",") if s]


class Numbered(torch.utils.data.Dataset):
    """Sample ``i``: the same on every run; corrupt when its global batch is poisoned."""

    def __len__(self):
        return batch_size * world * 400  # 400 batches a rank: the run stays in one epoch

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        y = x @ W_TRUE + 0.01 * torch.randn(1, generator=g)
        batch = i // (batch_size * world) + 1
        poisoned = not poison_ranks or str(i % world) in poison_ranks.split(",")
        for first, last in CORRUPT:
            if poisoned and first <= batch <= last:
                y = y * 10.0 ** (1 + batch - first)
        return x, y, i


dataset = Numbered()
sampler = torch.utils.data.DistributedSampler(dataset, shuffle=False) if world > 1 else None
loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, sampler=sampler)
data = monitor_client.DataStream(loader)  # monitor: counts batches by position, can skip them

model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps)
plan = None
mon = monitor_client.Monitor(url=url, project="rollback-demo", run_id=run_id,  # monitor
                             total_steps=steps)  # monitor
mon.watch(model, opt)  # monitor
log = open(os.path.join(out_dir, f"batches-r{rank}.log"), "w")  # noqa: SIM115 - the run's log

step = 0
while step < steps:
    for x, y, ids in mon.timed(data):  # monitor: timed() sends data.position with each step
        step += 1
        if step == pause_at:
            wait_for(pause_file)
        print(step, data.position, int(ids[0]), file=log, flush=True)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        factor = plan.lr_multiplier(step) if plan else 1.0  # monitor: 1.0 outside its window
        for group in opt.param_groups:
            group["lr"] *= factor
        opt.step()
        mon.log_step(step, loss=loss.detach(), samples=len(x))  # monitor: the LR used goes with it
        for group in opt.param_groups:  # the scheduler goes on from its own LR
            group["lr"] /= factor
        sched.step()
        time.sleep(step_delay)  # a step's pace, so the plan arrives mid-run
        if step % ckpt_every == 0:
            path = os.path.join(out_dir, f"ckpt-{step}.pt")
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict(), "rng": torch.get_rng_state(),
                            "step": step, "position": data.position}, path)
                if save_on == "rank0":
                    mon.checkpoint_saved(step, path)  # monitor: after the save
            if world > 1:
                dist.barrier()
            if save_on == "all":
                mon.checkpoint_saved(step, path)  # monitor
        if mon.should_stop():  # monitor: a rule stopped the run
            steps = step
            break
        found = mon.rollback_plan()  # monitor: every step, on every rank
        if found is not None:  # monitor
            plan = found
            state = torch.load(plan.checkpoint_path, weights_only=True)  # never unpickle code
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
            sched.load_state_dict(state["sched"])
            torch.set_rng_state(state["rng"])
            step = state["step"]  # the next step is plan.resume_step
            # where the checkpoint left the data, every window of the plan left out
            data.seek(state["position"], skip=() if ignore_window else plan.skip)
            mon.rolled_back(plan)  # monitor
            print("rollback", plan.id, plan.checkpoint_step, plan.skip_to,
                  ",".join(f"{a}-{b}" for a, b in plan.skip), file=log, flush=True)
            break  # the data restarts from the seek
        if step >= steps:
            break
weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
with open(os.path.join(out_dir, f"weights-r{rank}.txt"), "w") as f:
    f.write(weights.hexdigest())
wait_for(hold_file)
mon.close()  # monitor
if world > 1:
    dist.destroy_process_group()
