"""What ``DataStream.seek`` costs to the first batch after it: a shuffled map-style loader
(10 batches an epoch) resumed at position 0 with a window ``(1, N)`` left out, for N up to
10**12, and a stream (an ``IterableDataset``) resumed after position P, which it reads past.
Prints the seconds to the first batch and the batches drawn (map-style: index lists of the
batch sampler; stream: batches made). Compare a change with ``python -m bench.ab --rev REV
-- bench.data_seek`` (a revision before the arithmetic jump takes 7.9 s at N = 10**7
and never returns at 10**12: pass ``--largest 7`` there).

    python -m bench.data_seek
"""

from __future__ import annotations

import argparse
import time

import torch
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, RandomSampler

from monitor_client import DataStream


class Counted(BatchSampler):
    def __init__(self) -> None:
        super().__init__(RandomSampler(range(40)), 4, drop_last=False)
        self.drawn = 0

    def __iter__(self):
        for batch in super().__iter__():
            self.drawn += 1
            yield batch


class Stream(IterableDataset):
    def __init__(self) -> None:
        self.made = 0

    def __iter__(self):
        for i in range(10**9):
            self.made += 1
            yield i


def first_after(data: DataStream) -> float:
    began = time.perf_counter()
    next(iter(data))
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--largest", type=int, default=12, help="the largest window, 10**N")
    args = parser.parse_args()
    first_after(DataStream(DataLoader(list(range(8)), batch_size=4)))  # imports, warm-up
    for power in [p for p in (3, 5, 7, 9, 12) if p <= args.largest]:
        sampler = Counted()
        data = DataStream(DataLoader(list(range(40)), batch_sampler=sampler))
        data.seek(0, skip=[(1, 10**power)])
        took = first_after(data)
        print(f"map-style, window (1, 10**{power}): {took * 1e3:8.2f} ms to the first batch, "
              f"{sampler.drawn} batches drawn")
    for position in (10**3, 10**4):
        dataset = Stream()
        data = DataStream(DataLoader(dataset, batch_size=4))
        data.seek(position)
        took = first_after(data)
        print(f"stream, resumed after {position}: {took * 1e3:8.2f} ms to the first batch, "
              f"{dataset.made // 4} batches read past")


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
