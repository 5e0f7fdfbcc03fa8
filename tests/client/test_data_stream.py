"""DataStream (client/monitor_client/_data.py): a resumed stream yields exactly the
reference run's batches minus the skipped windows, in the same order, under a shuffled
sampler, a DistributedSampler shard, worker processes and across epochs; skipped batches
are never loaded; its state survives a save mid-epoch (what Lightning keeps); a plain
iterable of batches works the same, drawing and dropping."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
from pathlib import Path

import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    DistributedSampler,
    IterableDataset,
    RandomSampler,
)

from monitor_client import DataStream, RollbackPlan
from monitor_client._data import attach


class Numbered(Dataset):
    """Sample ``i`` is ``i``; every load is counted (``loaded``)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.loaded: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.loaded.append(i)
        return i


def _run(data: DataStream, batches: int) -> list[tuple[int, list[int]]]:
    """(position, sample ids) of the next ``batches`` batches, epoch after epoch."""
    out: list[tuple[int, list[int]]] = []
    while len(out) < batches:
        for batch in data:
            out.append((data.position, batch.tolist()))
            if len(out) == batches:
                break
    return out


def _reference(make, batches: int) -> dict[int, list[int]]:
    return dict(_run(DataStream(make()), batches))


def check_shuffled_resume(workers: int) -> None:
    def make():
        return DataLoader(Numbered(40), batch_size=4, shuffle=True, num_workers=workers)
    ref = _reference(make, 40)  # four data epochs of 10 batches
    data = DataStream(make())
    data.seek(7, skip=[(9, 13), (22, 24)])  # windows across the first epoch boundary
    resumed = _run(data, 20)
    want = [p for p in range(8, 41) if not (9 <= p <= 13 or 22 <= p <= 24)][:20]
    assert [p for p, _ in resumed] == want
    assert all(ids == ref[p] for p, ids in resumed)
    # Each data epoch is a fresh shuffle of every sample, whatever was skipped.
    assert sorted(sum((ref[p] for p in range(11, 21)), [])) == list(range(40))


def test_a_shuffled_loader_resumes_with_the_reference_order_minus_the_windows():
    check_shuffled_resume(0)


def test_a_loader_with_worker_processes_resumes_the_same():
    """Worker processes are forked: from the test process, a worker inherits whatever lock
    another test's thread held at that instant and can hang on it. A training script forks
    from its own process, so the checks with workers run in a fresh interpreter, as a
    script would."""
    _fresh_interpreter("check_shuffled_resume(2)")


def _fresh_interpreter(call: str) -> None:
    here = Path(__file__).resolve().parent
    path = os.pathsep.join(map(str, (here, here.parents[1] / "client", here.parents[1])))
    done = subprocess.run(
        [sys.executable, "-c", f"from test_data_stream import *; {call}"],
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]


def test_skipped_batches_are_never_loaded():
    dataset = Numbered(40)
    data = DataStream(DataLoader(dataset, batch_size=4, shuffle=True))
    ref = _reference(lambda: DataLoader(Numbered(40), batch_size=4, shuffle=True), 10)
    data.seek(2, skip=[(4, 8)])
    got = _run(data, 3)
    assert [p for p, _ in got] == [3, 9, 10]
    assert sorted(dataset.loaded) == sorted(ref[3] + ref[9] + ref[10])


def test_each_rank_of_a_distributed_sampler_resumes_its_own_shard():
    def make(rank):
        dataset = Numbered(64)
        return DataLoader(dataset, batch_size=4,
                          sampler=DistributedSampler(dataset, num_replicas=2, rank=rank, seed=3))
    for rank in (0, 1):
        ref = _reference(lambda r=rank: make(r), 24)
        data = DataStream(make(rank))
        data.seek(5, skip=[(7, 10)])
        resumed = _run(data, 8)
        assert [p for p, _ in resumed] == [6, 11, 12, 13, 14, 15, 16, 17]
        assert all(ids == ref[p] for p, ids in resumed)


def test_an_epoch_of_the_stream_is_an_epochs_worth_of_batches():
    data = DataStream(DataLoader(Numbered(40), batch_size=4, shuffle=True))
    data.seek(0, skip=[(3, 7)])
    first = [data.position for _ in data]
    assert len(first) == len(data) == 10 and first[-1] == 15  # it ran on into epoch 2


def test_the_state_mid_epoch_resumes_the_same_batches():
    def make():
        return DataLoader(Numbered(40), batch_size=4, shuffle=True)
    data = DataStream(make())
    data.seek(0, skip=[(2, 3)])
    it = iter(data)
    seen = [next(it).tolist() for _ in range(4)]
    state = data.state_dict()
    assert state == {"position": 6, "skip": [[2, 3]], "chunk_done": 4}
    rest = [b.tolist() for b in it]
    again = DataStream(make())
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == rest and len(seen) + len(rest) == 10


def check_abandoned_prefetch() -> None:
    data = DataStream(DataLoader(Numbered(40), batch_size=4, shuffle=True, num_workers=2))
    ref = _reference(lambda: DataLoader(Numbered(40), batch_size=4, shuffle=True), 12)
    it = iter(data)
    next(it), next(it)  # the workers were handed more than two
    del it
    assert [(data.position, b.tolist()) for b in itertools.islice(data, 3)] == \
        [(p, ref[p]) for p in (3, 4, 5)]


def test_an_abandoned_prefetch_is_drawn_again():
    _fresh_interpreter("check_abandoned_prefetch()")


def test_a_plain_iterable_of_batches_is_numbered_and_skipped_too():
    epoch = [[i, i + 1] for i in range(0, 20, 2)]  # 10 batches a pass
    data = DataStream(epoch)
    data.seek(8, skip=[(10, 12)])
    got = [(data.position, b) for b in itertools.islice(itertools.chain(data, data), 6)]
    assert got == [(9, [16, 17]), (13, [4, 5]), (14, [6, 7]), (15, [8, 9]), (16, [10, 11]),
                   (17, [12, 13])]


def test_a_plan_is_what_seek_takes():
    plan = RollbackPlan.from_action({
        "id": 2, "action": "rollback", "plan": {
            "checkpoint_step": 5, "checkpoint_path": "c", "resume_position": 5,
            "skip": [[6, 7], [9, 9]], "positions": "positions", "skip_from": 6, "skip_to": 8}})
    assert plan is not None and plan.skip_batches == 2
    data = DataStream(DataLoader(Numbered(40), batch_size=4))
    data.seek(plan.resume_position, skip=plan.skip)
    assert [data.position for _ in itertools.islice(data, 3)] == [8, 10, 11]


class CountedBatches(BatchSampler):
    """A shuffled batch sampler that counts the batches it draws (``drawn``)."""

    def __init__(self, n: int, batch_size: int) -> None:
        super().__init__(RandomSampler(range(n)), batch_size, drop_last=False)
        self.drawn = 0

    def __iter__(self):
        for batch in super().__iter__():
            self.drawn += 1
            yield batch


def test_a_window_of_any_size_is_jumped_not_walked():
    # Seeking walked every skipped position: (1, 10**7) took 7.9 s to the first batch and
    # (1, 10**12) never yielded. Whole epochs are jumped now; at most one epoch is drawn.
    def make():
        sampler = CountedBatches(40, 4)  # 10 batches an epoch
        return DataLoader(Numbered(40), batch_sampler=sampler), sampler
    for first, last in ((1, 10**6), (1, 10**12), (5, 10**9)):
        loader, sampler = make()
        data = DataStream(loader)
        data.seek(0, skip=[(first, last), (last + 2, last + 2)])
        kept = [*range(1, first), last + 1, last + 3, last + 4]
        assert [p for p, _ in _run(data, len(kept))] == kept
        assert sampler.drawn <= 2 * len(loader), (first, last, sampler.drawn)


def test_a_jumped_stream_yields_the_reference_batches():
    def make():
        return DataLoader(Numbered(40), batch_size=4, shuffle=True)
    ref = _reference(make, 60)  # six data epochs
    data = DataStream(make())
    data.seek(3, skip=[(5, 31), (33, 33), (40, 52)])
    got = _run(data, 6)
    assert [p for p, _ in got] == [4, 32, 34, 35, 36, 37]
    assert all(ids == ref[p] for p, ids in got)
    late = DataStream(make())
    late.seek(0, skip=[(1, 54)])  # five epochs and a half jumped
    assert _run(late, 3) == [(p, ref[p]) for p in (55, 56, 57)]


class Streamed(IterableDataset):
    """A stream of sample ids, reshuffled each pass by ``set_epoch`` (as HF ``datasets``'
    streaming shuffle is); every sample made is counted (``made``)."""

    def __init__(self, n: int) -> None:
        self.n, self.epoch, self.made = n, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.epoch))
        for i in order.tolist():
            self.made += 1
            yield i


def test_a_stream_is_counted_by_position_and_its_windows_read_past():
    def make():
        return DataLoader(Streamed(40), batch_size=4)  # 10 batches a pass, no length known
    ref = _reference(make, 25)  # over three passes, each its own order
    assert sorted(sum((ref[p] for p in range(11, 21)), [])) == list(range(40))
    data = DataStream(make())
    assert data.skips_by == "reading"
    try:
        len(data)
    except TypeError:
        pass
    else:
        raise AssertionError("a stream has no length (len 0 made Lightning train nothing)")
    data.seek(3, skip=[(5, 12)])  # across the first pass's end
    got = _run(data, 6)
    assert [p for p, _ in got] == [4, 13, 14, 15, 16, 17]
    assert all(ids == ref[p] for p, ids in got)


def test_attach_makes_a_streamed_loader_yield_the_stream():
    dataset = Streamed(40)
    loader = DataLoader(dataset, batch_size=4)
    ref = _reference(lambda: DataLoader(Streamed(40), batch_size=4), 20)
    batches = attach(loader, position=2, skip=[(4, 6)])
    assert batches is not None and batches.stream.skips_by == "reading"
    got = []
    for batch in loader:  # whoever iterates the loader now reads the stream
        got.append((batches.took(), batch.tolist()))
        if len(got) == 5:
            break
    assert got == [(p, ref[p]) for p in (3, 7, 8, 9, 10)]
    assert dataset.made == 10 * 4  # batches 1-10 made: the skipped ones read past
