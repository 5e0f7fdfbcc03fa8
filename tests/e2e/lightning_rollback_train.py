"""A user's Lightning script with the monitor's callback, written from the README and
client/README.md: a small regression module, a shuffled DataLoader wrapped in
``monitor_client.DataStream`` (so a resumed fit resumes the data where the checkpoint left
it), checkpoints every 10 steps, and ``--ckpt_path`` parsed and passed on, so
``python -m monitor_client.relaunch`` can relaunch it after a rollback. Samples
``--poison`` (ids) have NaN targets: the loss goes NaN at the batch that holds them.

Every training batch's sample ids are appended to ``<out_dir>/batches.log`` as ``<ids>``,
and each launch starts with ``launch <ckpt_path or ->``.

    python -m monitor_client.relaunch --dir out -- python lightning_rollback_train.py --out_dir out
"""

import argparse
import os
import time

import lightning.pytorch as pl
import torch

import monitor_client
from monitor_client.lightning import MonitorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--run_id", required=True)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--poison", default="")
parser.add_argument("--step_delay", type=float, default=0.1)  # a real model's step takes longer
parser.add_argument("--ckpt_path", default=None)
args = parser.parse_args()
poison = {int(i) for i in args.poison.split(",") if i}
log = open(os.path.join(args.out_dir, "batches.log"), "a")  # noqa: SIM115 - the run's log
print("launch", args.ckpt_path or "-", file=log, flush=True)


class Samples(torch.utils.data.Dataset):
    """Sample ``i``: the same on every run; a NaN target when poisoned."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        return x, x.sum(dim=0, keepdim=True) * (float("nan") if i in poison else 1.0), i


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        print(",".join(map(str, idx.tolist())), file=log, flush=True)
        time.sleep(args.step_delay)  # a step's pace, so the plan arrives mid-run
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


torch.manual_seed(0)
loader = torch.utils.data.DataLoader(Samples(), batch_size=4, shuffle=True)
saves = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(args.out_dir, "ckpts"),
                                     every_n_train_steps=10, save_top_k=-1)
trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=args.out_dir,
                     callbacks=[MonitorCallback(project="pl-e2e", run_id=args.run_id), saves])
trainer.fit(Regressor(), monitor_client.DataStream(loader), ckpt_path=args.ckpt_path)
print("done", file=log, flush=True)
