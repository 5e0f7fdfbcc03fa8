"""A user's Lightning script with the monitor's callback, written from docs/actions.md and
docs/client.md: a small regression module, a shuffled DataLoader (or, with ``--stream``, one
over a stream of the samples, an ``IterableDataset``) wrapped in ``monitor_client.DataStream``
(so a resumed fit resumes the data where the checkpoint left it), checkpoints every 10 steps,
and ``--ckpt_path`` parsed and passed on, so ``python -m monitor_client.relaunch`` can
relaunch it after a rollback. Samples ``--poison`` (ids) have NaN targets: the loss goes NaN
at the batch that holds them (the command line, the batch log and the samples:
``rollback_script.py``).

    python -m monitor_client.relaunch --dir out -- python lightning_rollback_train.py --out_dir out
"""

import os
import time

import lightning.pytorch as pl
import torch
from rollback_script import SAMPLES, Stream, regression_net, sample, start

import monitor_client
from monitor_client.lightning import MonitorCallback

args, poison, log = start("ckpt_path")


def example(i):
    return (*sample(i, poison), i)


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return example(i)


class Regressor(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = regression_net()

    def training_step(self, batch, batch_idx):
        x, y, idx = batch
        print(",".join(map(str, idx.tolist())), file=log, flush=True)
        time.sleep(args.step_delay)  # a step's pace, so the plan arrives mid-run
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


torch.manual_seed(0)
if args.stream:
    loader = torch.utils.data.DataLoader(Stream(example), batch_size=4)
else:
    loader = torch.utils.data.DataLoader(Samples(), batch_size=4, shuffle=True)
saves = pl.callbacks.ModelCheckpoint(dirpath=os.path.join(args.out_dir, "ckpts"),
                                     every_n_train_steps=10, save_top_k=-1)
trainer = pl.Trainer(max_steps=args.steps, accelerator="cpu", logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     default_root_dir=args.out_dir,
                     callbacks=[MonitorCallback(project="pl-e2e", run_id=args.run_id), saves])
trainer.fit(Regressor(), monitor_client.DataStream(loader), ckpt_path=args.ckpt_path)
print("done", file=log, flush=True)
