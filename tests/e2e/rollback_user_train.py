"""A user's plain training loop that closes the loop with the monitor: it reports its
checkpoints, and when the sidecar decides a rollback it reloads the last clean one and skips
the data window (README, "Closing the loop"). The monitoring is the lines marked
``# monitor``; everything else is the user's.

Its data is a stream of numbered batches (batch ``i`` is the same on every run and rank
keeps its own shard of it). A corrupt stretch of the stream, batches ``poison_from`` to
``poison_from + poison_len - 1``, has targets off by growing powers of ten: the loss and the
gradients run away from the first of them on (a divergence at a known step). Every batch id
trained on is written to ``<out_dir>/batches-r<rank>.log`` as ``<step> <batch>`` and each
rollback as ``rollback <id> <checkpoint_step> <skip_to>``, so a test can check what was
consumed. With ``WORLD_SIZE`` > 1 it runs DDP over gloo (``RANK``, ``MASTER_ADDR``/``PORT``:
``torchrun`` sets them), rank 0 saves the checkpoints and, by default, reports them alone
(``--save_on=all``: every rank reports the same file once it is saved); ``--poison_ranks=2,3``
corrupts only those ranks' shards. At the end each rank writes a digest of its weights to
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
poison_from = 65
poison_len = 12
step_delay = 0.05  # a real model's step takes this long at least; this one is tiny
save_on = "rank0"  # or "all"
poison_ranks = ""  # e.g. "2,3"; empty: every rank's shard
pause_at, pause_file, hold_file = 0, "", ""
for arg in sys.argv[1:]:
    key, val = arg[2:].split("=", 1)
    globals()[key] = type(globals()[key])(val)

rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


def wait_for(path):
    while path and not os.path.exists(path):
        time.sleep(0.05)


if world > 1:
    dist.init_process_group("gloo", rank=rank, world_size=world)
os.makedirs(out_dir, exist_ok=True)
torch.manual_seed(0)
torch.set_num_threads(1)
W_TRUE = torch.randn(8, 1)


def batch(i):
    """Batch ``i`` of the stream (this rank's shard)."""
    g = torch.Generator().manual_seed(1000 * i + rank)
    x = torch.randn(16, 8, generator=g)
    y = x @ W_TRUE + 0.01 * torch.randn(16, 1, generator=g)
    poisoned = not poison_ranks or str(rank) in poison_ranks.split(",")
    if poisoned and poison_from <= i < poison_from + poison_len:
        y = y * 10.0 ** (1 + i - poison_from)
    return x, y


model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
if world > 1:
    model = nn.parallel.DistributedDataParallel(model)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
mon = monitor_client.Monitor(url=url, project="rollback-demo", run_id=run_id,  # monitor
                             total_steps=steps)  # monitor
mon.watch(model, opt)  # monitor
log = open(os.path.join(out_dir, f"batches-r{rank}.log"), "w")  # noqa: SIM115 - the run's log

step, consumed, resumed = 0, 0, None
while step < steps:
    step += 1
    consumed += 1
    if step == pause_at:
        wait_for(pause_file)
    x, y = batch(consumed)
    print(step, consumed, file=log, flush=True)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    for group, lr in zip(opt.param_groups, sched.get_last_lr(), strict=True):  # the plan's LR factor
        group["lr"] = lr * (resumed.lr_multiplier(step) if resumed else 1.0)
    opt.step()
    sched.step()
    mon.log_step(step, loss=loss.detach(), samples=16)  # monitor
    time.sleep(step_delay)
    if step % ckpt_every == 0:
        path = os.path.join(out_dir, f"ckpt-{step}.pt")
        if rank == 0:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                        "sched": sched.state_dict(), "rng": torch.get_rng_state(),
                        "step": step, "consumed": consumed}, path)
            if save_on == "rank0":
                mon.checkpoint_saved(step, path)  # monitor
        if world > 1:
            dist.barrier()
        if save_on == "all":
            mon.checkpoint_saved(step, path)  # monitor
    plan = mon.rollback_plan()  # monitor
    if plan is not None:  # monitor
        state = torch.load(plan.checkpoint_path, weights_only=False)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        sched.load_state_dict(state["sched"])
        torch.set_rng_state(state["rng"])
        step, consumed = state["step"], state["consumed"] + plan.skip_batches
        resumed = plan
        mon.rolled_back(plan)  # monitor
        print("rollback", plan.id, plan.checkpoint_step, plan.skip_to, file=log, flush=True)
weights = hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters()))
with open(os.path.join(out_dir, f"weights-r{rank}.txt"), "w") as f:
    f.write(weights.hexdigest())
wait_for(hold_file)
mon.close()  # monitor
if world > 1:
    dist.destroy_process_group()
