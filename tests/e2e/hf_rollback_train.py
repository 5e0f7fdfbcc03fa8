"""A user's HuggingFace ``Trainer`` script with the monitor's callback, written from
docs/actions.md and docs/client.md: a small regression model, a shuffled sampler (the Trainer's
default) or, with ``--stream``, the samples as a stream (an ``IterableDataset``), checkpoints
every 10 steps, and ``--resume_from_checkpoint`` parsed and passed on, so ``python -m
monitor_client.relaunch`` can relaunch it after a rollback. Samples ``--poison`` (ids) have
NaN targets: the loss goes NaN at the batch that holds them (the command line, the batch
log and the samples: ``rollback_script.py``).

    python -m monitor_client.relaunch --dir out -- python hf_rollback_train.py --out_dir out
"""

import time

import torch
import transformers
from rollback_script import SAMPLES, Stream, regression_net, sample, start

from monitor_client.hf import MonitorCallback

args, poison, log = start("resume_from_checkpoint")


def example(i):
    x, y = sample(i, poison)
    return {"x": x, "y": y, "idx": i}


class Samples(torch.utils.data.Dataset):
    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return example(i)


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = regression_net()

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
trainer = transformers.Trainer(model=Regressor(), args=training,
                               train_dataset=Stream(example) if args.stream else Samples(),
                               callbacks=[MonitorCallback(project="hf-e2e", run_id=args.run_id)])
trainer.train(resume_from_checkpoint=args.resume_from_checkpoint)
print("done", file=log, flush=True)
