"""A user's HuggingFace ``Trainer`` script with the monitor's callback, written from the
README and client/README.md: a small regression model, a shuffled sampler (the Trainer's
default), checkpoints every 10 steps, and ``--resume_from_checkpoint`` parsed and passed
on, so ``python -m monitor_client.relaunch`` can relaunch it after a rollback. Samples
``--poison`` (ids) have NaN targets: the loss goes NaN at the batch that holds them.

Every training batch's sample ids are appended to ``<out_dir>/batches.log`` as ``<ids>``,
and each launch starts with ``launch <resume_from_checkpoint or ->``.

    python -m monitor_client.relaunch --dir out -- python hf_rollback_train.py --out_dir out
"""

import argparse
import os
import time

import torch
import transformers

from monitor_client.hf import MonitorCallback

parser = argparse.ArgumentParser()
parser.add_argument("--out_dir", required=True)
parser.add_argument("--run_id", required=True)
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--poison", default="")
parser.add_argument("--step_delay", type=float, default=0.1)  # a real model's step takes longer
parser.add_argument("--resume_from_checkpoint", default=None)
args = parser.parse_args()
poison = {int(i) for i in args.poison.split(",") if i}
log = open(os.path.join(args.out_dir, "batches.log"), "a")  # noqa: SIM115 - the run's log
print("launch", args.resume_from_checkpoint or "-", file=log, flush=True)


class Samples(torch.utils.data.Dataset):
    """Sample ``i``: the same on every run; a NaN target when poisoned."""

    def __len__(self):
        return 256

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        x = torch.randn(8, generator=g)
        y = x.sum(dim=0, keepdim=True) * (float("nan") if i in poison else 1.0)
        return {"x": x, "y": y, "idx": i}


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))

    def forward(self, x, y, idx=None):
        if self.training and idx is not None:
            print(",".join(map(str, idx.tolist())), file=log, flush=True)
            time.sleep(args.step_delay)  # a step's pace, so the plan arrives mid-run
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}


torch.manual_seed(0)
training = transformers.TrainingArguments(
    output_dir=args.out_dir, max_steps=args.steps, per_device_train_batch_size=4,
    learning_rate=1e-2, save_strategy="steps", save_steps=10, logging_steps=10,
    report_to=[], use_cpu=True, disable_tqdm=True, dataloader_num_workers=0, seed=7)
trainer = transformers.Trainer(model=Regressor(), args=training, train_dataset=Samples(),
                               callbacks=[MonitorCallback(project="hf-e2e", run_id=args.run_id)])
trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
print("done", file=log, flush=True)
