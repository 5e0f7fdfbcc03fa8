"""``DataStream``: a training loop's data counted by position, resumable at a position and
skipping windows, whatever the sampler.

A rollback plan (README, "Closing the loop") names **data positions**: batches of the run's
data stream consumed, counted over the whole run. The stream resumes after the plan's
``resume_position`` and never trains a position inside one of its ``skip`` windows. Steps
cannot say that: once a rollback jumped over a window, step and position differ, and a loop
that fast-forwards by steps lands in the wrong place (issue 31 trained 20 corrupt batches 31
times that way). So the data says where it is:

- Position ``p`` (1-based) is the ``p``-th batch of an endless sequence of the loader's
  epochs: ``p = e * L + i + 1`` for batch ``i`` of data epoch ``e`` (``L`` batches each).
  Each data epoch draws its order afresh from the epoch number alone: a ``set_epoch(e)``
  sampler (``DistributedSampler``, accelerate's seedable one) is told it, and a torch
  ``RandomSampler`` gets a generator seeded with ``seed + e``. So the order of positions is
  the same in every process that makes the same stream: a relaunch, a rollback, another
  rank (each with its own ``DistributedSampler`` shard, at the same positions).
- Resuming at ``position`` and skipping windows happens at the batch sampler: the
  skipped batches' indices are drawn and dropped, never loaded, and every other batch
  keeps its place in the order (a shuffled sampler is not re-shuffled by the skip: the
  dataset's length does not change). Whole epochs inside a window are jumped by
  arithmetic, so a window of any size costs at most one epoch of index draws.
- Each ``iter()`` yields one epoch's worth, ``len(stream)`` batches, continuing the stream
  (a stretch may span two data epochs once windows were skipped): a framework's epoch
  accounting stays what it was without the skips.

Used three ways: a plain loop wraps its ``DataLoader`` (``DataStream(loader)``) and passes
``data_position=data.position`` to ``log_step`` (``mon.timed(data)`` does it), saves
``data.position`` with its checkpoint and, on a plan, ``data.seek(saved, skip=plan.skip)``;
Lightning takes it as a stateful loader (``state_dict``/``load_state_dict``: its checkpoint
keeps the position, so ``fit(ckpt_path=...)`` resumes the data where the step was, which a
plain DataLoader does not); the HF callback puts the same batch sampler into the
Trainer's own DataLoader (``attach``).

A shuffled loader of 10 batches a data epoch, resumed at position 3 and skipping 5-7::

    >>> import torch
    >>> from torch.utils.data import DataLoader
    >>> loader = DataLoader(list(range(40)), batch_size=4, shuffle=True)
    >>> plain = DataStream(loader)
    >>> first = [(plain.position, b.tolist()) for b in plain][:8]
    >>> data = DataStream(loader)
    >>> data.seek(3, skip=[(5, 7)])
    >>> resumed = [(data.position, b.tolist()) for b in data]
    >>> [p for p, _ in resumed][:5], len(resumed) == len(loader)
    ([4, 8, 9, 10, 11], True)
    >>> [b for p, b in resumed[:2]] == [b for p, b in first if p in (4, 8)]
    True
"""

from __future__ import annotations

import collections
import contextlib
import itertools
from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["DataStream", "StreamBatches", "attach", "merge_windows"]

Window = tuple[int, int]


def merge_windows(windows: Iterable[Iterable[int]]) -> tuple[Window, ...]:
    """Inclusive ``(first, last)`` windows, sorted, overlapping or adjacent ones joined.

        >>> merge_windows([(301, 330), (320, 355), (100, 120)])
        ((100, 120), (301, 355))
    """
    out: list[list[int]] = []
    for first, last in sorted((int(w[0]), int(w[1])) for w in (tuple(w) for w in windows)):
        if last < first:
            continue
        if out and first <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], last)
        else:
            out.append([first, last])
    return tuple((a, b) for a, b in out)


class _Stream:
    """The endless, numbered sequence of a batch sampler's (or an iterable's) items, from
    a position on, windows left out; shared by ``StreamBatches`` and ``DataStream``."""

    def __init__(self, items: Any, seed: int) -> None:
        self.items = items
        self.seed = int(seed)
        self.windows: tuple[Window, ...] = ()
        self.position = 0      # the last position consumed
        self.chunk_done = 0    # consumed in the current epoch's worth (see module docstring)
        # Positions handed out (to a DataLoader that may prefetch) and not yet consumed.
        self.handed: collections.deque[int] = collections.deque()
        self._source: Iterator[tuple[int, Any]] | None = None

    @property
    def epoch_len(self) -> int | None:
        try:
            return len(self.items)
        except TypeError:
            return None

    def seek(self, position: int, skip: Iterable[Iterable[int]] = ()) -> None:
        self.windows = merge_windows([*self.windows, *skip])
        self.position, self.chunk_done = int(position), 0
        self.restart()

    def restart(self) -> None:
        """Draw again from the consumed position (what was handed out and not consumed, a
        prefetch, is drawn again in order)."""
        self.handed.clear()
        self._source = None

    def took(self) -> int:
        """The loop consumed the next batch handed out: its position. An epoch's worth
        consumed starts the next one (``chunk_done`` back to 0)."""
        if self.handed:
            self.position = self.handed.popleft()
            self.chunk_done += 1
            if self.epoch_len and self.chunk_done >= self.epoch_len:
                self.chunk_done = 0
        return self.position

    def skipped(self, position: int) -> bool:
        return any(a <= position <= b for a, b in self.windows)

    def kept_from(self, position: int) -> int:
        """The first position at or after ``position`` that no window leaves out: one pass
        over the (sorted, merged) windows, whatever their size."""
        for first, last in self.windows:
            if first <= position <= last:
                position = last + 1
            elif first > position:
                break
        return position

    def take(self) -> tuple[int, Any] | None:
        """The next kept (position, item), or None when the stream ran dry."""
        if self._source is None:
            self._source = self._numbered(self.position)
        return next(self._source, None)

    def _numbered(self, start: int) -> Iterator[tuple[int, Any]]:
        """(position, item) of every kept position after ``start``. Skipping costs what the
        source allows, never the size of a window: with a known epoch length whole epochs
        are jumped by arithmetic (each epoch's order is a function of its number), and
        inside an epoch the items before the next kept position are drawn and dropped at
        most once (a batch sampler draws indices, nothing is loaded). A source without a
        length (an iterable dataset, a stream) can only be read past, item by item."""
        length = self.epoch_len
        want = self.kept_from(start + 1)  # the next position to hand out
        epoch = (want - 1) // length if length else 0
        base = epoch * length if length else 0  # the position before the epoch's first
        while True:
            self.set_epoch(epoch)
            source, at, drew = iter(self.items), base, False
            while not (length and want > base + length):  # else the epoch's rest is skipped
                dropped = _drop(source, want - at - 1)
                at += dropped
                item = next(source, _END) if at == want - 1 else _END
                if item is _END:
                    drew = drew or dropped > 0
                    break
                at, drew = at + 1, True
                yield at, item
                want = self.kept_from(at + 1)
            else:
                drew = True  # jumped, not run dry
            if not drew:
                return  # an empty or one-shot iterable: nothing more to number
            if length:  # the epoch of ``want`` (a pass shorter than its length ends early)
                epoch = max((want - 1) // length, epoch + 1)
                base = epoch * length
                want = self.kept_from(max(want, base + 1))
            else:
                epoch, base = epoch + 1, at

    def set_epoch(self, epoch: int) -> None:
        """Make data epoch ``epoch``'s order a function of the epoch (module docstring)."""
        import torch

        seen: set[int] = set()
        for holder in _samplers(self.items):
            if id(holder) in seen:
                continue
            seen.add(id(holder))
            set_epoch = getattr(holder, "set_epoch", None)
            if callable(set_epoch):
                set_epoch(epoch)
            if isinstance(holder, torch.utils.data.RandomSampler):
                holder.generator = torch.Generator().manual_seed(self.seed + epoch)


_END = object()


def _drop(source: Iterator[Any], count: int) -> int:
    """Draw ``count`` items of ``source`` and drop them; how many there were."""
    dropped = 0
    for _ in itertools.islice(source, max(count, 0)):
        dropped += 1
    return dropped


def _samplers(items: Any) -> list[Any]:
    """The batch sampler, its samplers, and a wrapped one's (accelerate's shard)."""
    out = [items]
    for name in ("batch_sampler", "sampler"):
        inner = getattr(items, name, None)
        if inner is not None and inner is not items:
            out += _samplers(inner)
    return out


class StreamBatches:
    """A batch sampler over a ``_Stream``: each ``iter()`` yields one epoch's worth of
    kept batches (``len`` of the wrapped batch sampler), appending each one's position to
    ``stream.handed``; ``took()`` pops them as the loop consumes the batches in order."""

    def __init__(self, stream: _Stream) -> None:
        self.stream = stream

    def __len__(self) -> int:
        return self.stream.epoch_len or 0

    def __iter__(self) -> Iterator[Any]:
        stream = self.stream
        if stream.handed:  # a prefetch abandoned: draw those batches again
            stream.restart()
        for _ in range(max(len(self) - stream.chunk_done, 0)):
            got = stream.take()
            if got is None:
                return
            stream.handed.append(got[0])
            yield got[1]

    def set_epoch(self, epoch: int) -> None:
        """A framework's epoch is not the data's: the stream sets its own (ignored)."""

    def took(self) -> int:
        """The loop consumed the next batch: its position (the last one, when the loop
        consumed more than was handed out)."""
        return self.stream.took()


class DataStream:
    """A loader's batches by data position, resumable at a position, skipping windows (the
    module docstring says how; README "Closing the loop" has the loop).

    ``loader``: a ``torch.utils.data.DataLoader`` over a map-style dataset (skips happen in
    its batch sampler: nothing skipped is loaded, nothing else moves), or any re-iterable
    of batches, one epoch per pass (then skipped batches are drawn and dropped). ``seed``:
    what a shuffled ``RandomSampler``'s order is drawn from, with the epoch.

    ``position`` is the last batch consumed; ``seek(position, skip=plan.skip)`` resumes
    after ``position`` and leaves out the windows (they add up); ``state_dict`` /
    ``load_state_dict`` carry both (Lightning keeps them in its checkpoints)."""

    def __init__(self, loader: Any, *, seed: int = 0) -> None:
        self.loader = loader
        self._batches: StreamBatches | None = None
        sampler = _batch_sampler(loader)
        if sampler is not None:
            self._stream = _Stream(sampler, seed)
            self._batches = StreamBatches(self._stream)
            self._iterable: Any = _sibling(loader, self._batches)
        else:
            self._stream = _Stream(loader, seed)
            self._iterable = None
        # A framework that prefetches (Lightning does not, for a sized loader) reports
        # consumption itself (``took``); a plain loop consumes as it is handed a batch.
        self.reported = False

    @property
    def position(self) -> int:
        """The last data position consumed (0 before any)."""
        return self._stream.position

    @property
    def skip(self) -> tuple[Window, ...]:
        return self._stream.windows

    def seek(self, position: int, skip: Iterable[Iterable[int]] = ()) -> None:
        """Resume after ``position``; never yield a position inside ``skip``'s windows
        (inclusive, added to the ones already skipped)."""
        self._stream.seek(position, skip)

    def add_skip(self, skip: Iterable[Iterable[int]]) -> None:
        """Leave ``skip``'s windows out too, from wherever the stream is (a framework that
        restored the position itself: Lightning's ``load_state_dict``)."""
        self._stream.windows = merge_windows([*self._stream.windows, *skip])

    def __len__(self) -> int:
        return self._stream.epoch_len or 0

    def __iter__(self) -> Iterator[Any]:
        stream = self._stream
        if self._iterable is not None:
            for batch in self._iterable:
                if not self.reported:
                    self.took()
                yield batch
            return
        if stream.handed:
            stream.restart()
        length = stream.epoch_len
        remaining = length - stream.chunk_done if length else None
        while remaining is None or remaining > 0:
            got = stream.take()
            if got is None:
                return
            stream.handed.append(got[0])
            if not self.reported:
                self.took()
            yield got[1]
            remaining = None if remaining is None else remaining - 1

    def took(self) -> int:
        """The loop consumed the next batch handed out: its position (a framework that
        prefetches calls it as it consumes, with ``reported`` set)."""
        return self._stream.took()

    def state_dict(self) -> dict[str, Any]:
        stream = self._stream
        return {"position": stream.position, "skip": [list(w) for w in stream.windows],
                "chunk_done": stream.chunk_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Where a checkpoint left the data; windows already set (a plan's) are kept."""
        self.seek(int(state.get("position", 0)), state.get("skip") or ())
        self._stream.chunk_done = int(state.get("chunk_done", 0))


def attach(loader: Any, position: int = 0, skip: Iterable[Iterable[int]] = (),
           seed: int = 0) -> StreamBatches | None:
    """Put a ``StreamBatches`` into ``loader`` (a DataLoader, or accelerate's wrapper of one,
    as the HF Trainer builds it), in place: its batches then come from the stream, resumed
    after ``position`` and leaving ``skip`` out. None when ``loader`` has no batch sampler
    over a map-style dataset (an iterable dataset): nothing can be skipped there."""
    base = _base(loader)
    sampler = _batch_sampler(base)
    if sampler is None:
        return None
    stream = _Stream(sampler, seed)
    stream.seek(position, skip)
    batches = StreamBatches(stream)
    # DataLoader refuses to set batch_sampler after it is built; its iterators read it
    # afresh at each iter(), so the instance attribute is all there is to change.
    object.__setattr__(base, "batch_sampler", batches)
    return batches


def _base(loader: Any) -> Any:
    """accelerate's DataLoaderShard wraps a torch DataLoader (``base_dataloader``)."""
    with contextlib.suppress(AttributeError):
        return object.__getattribute__(loader, "base_dataloader")
    return loader


def _batch_sampler(loader: Any) -> Any:
    """``loader``'s batch sampler when it is a DataLoader over a map-style dataset."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is there whenever a DataLoader is
        return None
    if not isinstance(loader, torch.utils.data.DataLoader):
        return None
    if isinstance(loader.dataset, torch.utils.data.IterableDataset):
        return None
    return loader.batch_sampler


def _sibling(loader: Any, batches: StreamBatches) -> Any:
    """A DataLoader like ``loader`` whose batches come from ``batches`` (in order)."""
    import torch

    workers = loader.num_workers
    return torch.utils.data.DataLoader(
        loader.dataset, batch_sampler=batches, num_workers=workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context if workers else None,
        generator=loader.generator, prefetch_factor=loader.prefetch_factor if workers else None,
        persistent_workers=loader.persistent_workers if workers else False,
        pin_memory_device=loader.pin_memory_device, in_order=True)
