"""A user's HuggingFace ``Trainer`` script under ``torchrun``, written from docs/actions.md
("Under HF Trainer and Lightning", "Healing") and docs/client.md: a small regression model
trained data-parallel (gloo, CPU), the samples in order (``train_sampling_strategy=
"sequential"``), a checkpoint every 10 steps, and the monitor's callback asked where a
relaunch resumes. torchrun's ``--max-restarts`` is the only relaunch: the monitor's
rollback and restart both leave with exit 75.

    torchrun --nproc-per-node=2 --max-restarts=3 hf_torchrun_train.py --out_dir out \\
        --run_id R --poison 97 --hang_step 25 --hang_launch 1

Faults: samples ``--poison`` (ids) have NaN targets (a data fault: the loss goes NaN on the
step that trains one); on launch ``--hang_launch`` (0, 1, ...: the launches that reached
training) rank 1's training thread blocks in a callback before step ``--hang_step`` (the
other rank waits in DDP's all-reduce). Each rank appends ``resume <launch> <global step>``
at the start of each launch and ``<launch> <step> <sample ids>`` for each step it trains to
``<out_dir>/steps-r<rank>.log``, and at the end a digest of its weights to
``<out_dir>/weights-r<rank>.txt``.
"""

import argparse
import hashlib
import os
import time

import torch
import transformers

from monitor_client import MonitorSettings
from monitor_client.hf import MonitorCallback

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
        y = x.sum(dim=0, keepdim=True) * (float("nan") if i in poison else 1.0)
        return {"x": x, "y": y, "idx": i}


class Regressor(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(),
                                       torch.nn.Linear(16, 1))
        self.trained: list[int] = []

    def forward(self, x, y, idx=None):
        if self.training and idx is not None:
            self.trained += idx.tolist()
            time.sleep(args.step_delay)  # a real step takes longer
        return {"loss": torch.nn.functional.mse_loss(self.net(x), y)}


class StepLog(transformers.TrainerCallback):
    def on_train_begin(self, args_, state, control, **kwargs):
        print("resume", launch, state.global_step, file=log, flush=True)

    def on_step_begin(self, args_, state, control, **kwargs):
        if launch == args.hang_launch and rank == 1 and state.global_step + 1 == args.hang_step:
            time.sleep(3600)  # stuck: the other rank waits in the all-reduce

    def on_step_end(self, args_, state, control, **kwargs):
        print(launch, state.global_step, ",".join(map(str, model.trained)), file=log,
              flush=True)
        model.trained.clear()


torch.manual_seed(0)
model = Regressor()
training = transformers.TrainingArguments(
    output_dir=args.out_dir, max_steps=args.steps, per_device_train_batch_size=4,
    learning_rate=1e-2, save_strategy="steps", save_steps=10, logging_steps=10,
    train_sampling_strategy="sequential", report_to=[], use_cpu=True, disable_tqdm=True,
    dataloader_num_workers=0, seed=7)
monitor = MonitorCallback(project="hf-torchrun", run_id=args.run_id,
                          settings=MonitorSettings(watchdog_floor=2, linger=0.1))
trainer = transformers.Trainer(model=model, args=training, train_dataset=Samples(),
                               callbacks=[monitor, StepLog()])
trainer.train(resume_from_checkpoint=monitor.resume_checkpoint(trainer))
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()
with open(os.path.join(args.out_dir, f"weights-r{rank}.txt"), "w") as out:
    print(trainer.state.global_step, digest, file=out)
