"""What the HF and Lightning rollback scripts share (``hf_rollback_train.py``,
``lightning_rollback_train.py``): their command line, the batch log, and the samples.

The command line: ``--out_dir``, ``--run_id``, ``--steps``, ``--poison`` (sample ids with a
NaN target), ``--step_delay``, ``--stream`` (the samples arrive as a stream, an
``IterableDataset``, instead of a map-style dataset) and the framework's resume argument,
which ``python -m monitor_client.relaunch`` passes. Each launch appends ``launch <resume
argument or ->`` to ``<out_dir>/batches.log``, then each training batch its sample ids.
"""

import argparse
import os

import torch


def start(resume_argument: str) -> tuple[argparse.Namespace, set[int], object]:
    """The parsed command line, the poisoned ids, and the batch log (launch written)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--out_dir", required=True)
    parser.add_argument("--run_id", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--poison", default="")
    parser.add_argument("--step_delay", type=float, default=0.1)  # a real step takes longer
    parser.add_argument("--stream", action="store_true")
    parser.add_argument(f"--{resume_argument}", default=None)
    args = parser.parse_args()
    poison = {int(i) for i in args.poison.split(",") if i}
    log = open(os.path.join(args.out_dir, "batches.log"), "a")  # noqa: SIM115 - the run's log
    print("launch", getattr(args, resume_argument) or "-", file=log, flush=True)
    return args, poison, log


def sample(i: int, poison: set[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``i`` (x, y): the same on every run; a NaN target when poisoned."""
    g = torch.Generator().manual_seed(i)
    x = torch.randn(8, generator=g)
    return x, x.sum(dim=0, keepdim=True) * (float("nan") if i in poison else 1.0)


def regression_net() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


SAMPLES = 256


def stream_order(epoch: int) -> list[int]:
    """The order the stream brings the samples in on pass ``epoch`` (a streamed corpus,
    shuffled afresh each pass, as HF ``datasets`` streaming with ``shuffle`` does)."""
    return torch.randperm(SAMPLES, generator=torch.Generator().manual_seed(1000 + epoch)).tolist()


class Stream(torch.utils.data.IterableDataset):
    """The samples as a stream: ``make(i)`` is what sample ``i`` becomes (a dict for HF, a
    tuple for Lightning); ``set_epoch`` reshuffles (the trainer, or the monitor's data
    stream, tells it the pass)."""

    def __init__(self, make):
        self.make, self.epoch = make, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        for i in stream_order(self.epoch):
            yield self.make(i)
