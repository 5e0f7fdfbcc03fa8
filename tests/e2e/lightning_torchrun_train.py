"""A user's Lightning script under ``torchrun``, written from docs/actions.md ("Under HF
Trainer and Lightning", "Healing") and docs/client.md: a small regression module trained
with the DDP strategy (gloo, CPU), its train loader (each rank's shard of the samples, in
order) wrapped in ``monitor_client.DataStream``, a checkpoint every 10 steps, and the
monitor's callback asked where a relaunch resumes. torchrun's ``--max-restarts`` is the only
relaunch: the monitor's rollback and restart both leave with exit 75.

    torchrun --nproc-per-node=2 --max-restarts=3 lightning_torchrun_train.py --out_dir out \\
        --run_id R --poison 97 --hang_step 25 --hang_launch 1

The faults and the logs are ``hf_torchrun_train.py``'s.
"""

import argparse
import hashlib
import os
import time

import lightning.pytorch as pl
import torch

import monitor_client
from monitor_client.lightning import MonitorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--run_id", required=True)
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--poison", default="")
parser.add_argument("--hang_step", type=int, default=-1)
parser.add_argument("--hang_launch", type=int, default=0)
parser.add_argument("--step_delay", type=float, default=0.1)
args = parser.parse_args()
poison = {int(i) for i in args.poison.split(",") if i}
rank = int(os.environ.get("RANK", "0"))
log_path = os.path.join(args.out_dir, f"steps-r{rank}.log")
# The launch is counted by the launches that reached training, not by torchrun's restart
# count: a launch that fails before it (its group's port taken by another process on a busy
# machine) is torchrun's business and must not move the hang to another launch.
launch = (sum(line.startswith("resume") for line in open(log_path))  # noqa: SIM115
          if os.path.exists(log_path) else 0)
log = open(log_path, "a")  # noqa: SIM115


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return 1024

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(dim=0, keepdim=True) * (float("nan") if i in poison else 1.0), i


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def train_dataloader(self):
        samples = Samples()
        shard = torch.utils.data.DistributedSampler(samples, shuffle=False)
        return monitor_client.DataStream(
            torch.utils.data.DataLoader(samples, batch_size=4, sampler=shard))

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        time.sleep(args.step_delay)  # a real step takes longer
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class StepLog(pl.Callback):
    def on_train_start(self, trainer, module):
        print("resume", launch, trainer.global_step, file=log, flush=True)

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if launch == args.hang_launch and rank == 1 and trainer.global_step + 1 == args.hang_step:
            time.sleep(3600)  # stuck: the other rank waits in the all-reduce

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        print(launch, trainer.global_step, ",".join(map(str, batch[2].tolist())), file=log,
              flush=True)


torch.manual_seed(0)
monitor = MonitorCallback(project="pl-torchrun", run_id=args.run_id,
                          settings=monitor_client.MonitorSettings(watchdog_floor=2, linger=0.1))
saves = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(args.out_dir, "ckpts"),
                                     every_n_train_steps=10, save_top_k=-1)
trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", devices=2, strategy="ddp",
                     logger=False, enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=args.out_dir, callbacks=[monitor, saves, StepLog()])
module = Regressor()
trainer.fit(module, ckpt_path=monitor.resume_checkpoint(trainer))
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in module.parameters())).hexdigest()
with open(os.path.join(args.out_dir, f"weights-r{rank}.txt"), "w") as out:
    print(trainer.global_step, digest, file=out)
