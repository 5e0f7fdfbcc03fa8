"""The numbered stream under ``DataStream`` (_data.py): a source's items by data position,
from a position on, windows left out, and what it costs to leave them out.

Position ``p`` (1-based) is the ``p``-th item of an endless sequence of the source's
passes (its data epochs): ``p = e * L + i + 1`` for item ``i`` of pass ``e`` when each
pass holds ``L``. The source is one of two kinds, and the kind decides how a window is
left out (``Stream.skips_by``):

- a **batch sampler** (a DataLoader over a map-style dataset): its items are the indices
  of a batch; a window is **left out in the sampler** (its indices drawn and dropped,
  nothing loaded), and a pass's order is a function of its number (``set_epoch``), so
  whole passes inside a window are jumped by arithmetic;
- **data** (a DataLoader over an iterable dataset, a stream, any re-iterable of batches):
  a window is **read past**, its batches made and dropped, since a stream has no index to
  jump to; a pass of known length is still jumped whole.

A pass of 4 batches, resumed after position 2, leaving 4-6 out::

    >>> stream = Stream(["a", "b", "c", "d"], seed=0)
    >>> stream.seek(2, skip=[(4, 6)])
    >>> [stream.take() for _ in range(3)]
    [(3, 'c'), (7, 'c'), (8, 'd')]
    >>> stream.skips_by
    'reading'
"""

from __future__ import annotations

import collections
import itertools
from collections.abc import Iterable, Iterator
from typing import Any, Literal

__all__ = ["Stream", "StreamBatches", "Window", "merge_windows"]

Window = tuple[int, int]
SkipsBy = Literal["sampler", "reading"]
_END = object()


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


class Stream:
    """The endless, numbered sequence of ``items``' passes (a batch sampler's, or data:
    ``sampler`` says which), from a position on, windows left out; shared by
    ``StreamBatches`` and ``DataStream``."""

    def __init__(self, items: Any, seed: int, sampler: bool = False) -> None:
        self.items = items
        self.seed = int(seed)
        self.skips_by: SkipsBy = "sampler" if sampler else "reading"
        self.windows: tuple[Window, ...] = ()
        self.position = 0  # the last position consumed
        self.chunk_done = 0  # consumed in the current epoch's worth (_data.py)
        # Positions handed out (to a DataLoader that may prefetch) and not yet consumed.
        self.handed: collections.deque[int] = collections.deque()
        self._source: Iterator[tuple[int, Any]] | None = None
        self._sought = (0, 0)  # (position, chunk_done) of the last seek

    @property
    def epoch_len(self) -> int | None:
        try:
            return len(self.items)
        except TypeError:
            return None

    def seek(self, position: int, skip: Iterable[Iterable[int]] = (), chunk_done: int = 0
             ) -> None:
        self.windows = merge_windows([*self.windows, *skip])
        self.position, self.chunk_done = int(position), int(chunk_done)
        self._sought = (self.position, self.chunk_done)
        self.restart()

    def unconsume(self, most: int = 1024) -> None:
        """Count what was consumed since the last seek as handed out only (a framework that
        fetched ahead before it said it reports consumption itself): back to the seek's
        position, those positions first in ``handed``. Nothing when more than ``most``
        were consumed (not a fetch ahead: a loop that trained them)."""
        start, done = self._sought
        if self.position - start > most:
            return
        again: list[int] = []
        at = self.kept_from(start + 1)
        while at <= self.position:
            again.append(at)
            at = self.kept_from(at + 1)
        self.handed.extendleft(reversed(again))
        self.position, self.chunk_done = start, done

    def restart(self) -> None:
        """Draw again from the consumed position (what was handed out and not consumed, a
        prefetch, is drawn again in order)."""
        self.handed.clear()
        self._source = None

    def took(self) -> int:
        """The loop consumed the next item handed out: its position. An epoch's worth
        consumed starts the next one (``chunk_done`` back to 0)."""
        if self.handed:
            self.position = self.handed.popleft()
            self.chunk_done += 1
            if self.epoch_len and self.chunk_done >= self.epoch_len:
                self.chunk_done = 0
        return self.position

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

    def chunk(self) -> Iterator[Any]:
        """One epoch's worth of kept items from where the stream is (endless when a pass
        has no length), each one's position appended to ``handed`` as it goes out."""
        if self.handed:  # a prefetch abandoned: draw those items again
            self.restart()
        length = self.epoch_len
        left = None if length is None else max(length - self.chunk_done, 0)
        while left is None or left > 0:
            got = self.take()
            if got is None:
                return
            self.handed.append(got[0])
            yield got[1]
            left = None if left is None else left - 1

    def _numbered(self, start: int) -> Iterator[tuple[int, Any]]:
        """(position, item) of every kept position after ``start``. Skipping costs what the
        source allows, never the size of a window: with a known pass length whole passes
        are jumped by arithmetic, and inside a pass the items before the next kept
        position are drawn and dropped once (module docstring). A source without a length
        (an iterable dataset, a stream) can only be read past, item by item."""
        length = self.epoch_len
        want = self.kept_from(start + 1)  # the next position to hand out
        epoch = (want - 1) // length if length else 0
        base = epoch * length if length else 0  # the position before the pass's first
        while True:
            self.set_epoch(epoch)
            source, at, drew = iter(self.items), base, False
            while not (length and want > base + length):  # else the pass's rest is skipped
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
            if length:  # the pass of ``want`` (a pass shorter than its length ends early)
                epoch = max((want - 1) // length, epoch + 1)
                base = epoch * length
                want = self.kept_from(max(want, base + 1))
            else:
                epoch, base = epoch + 1, at

    def set_epoch(self, epoch: int) -> None:
        """Make pass ``epoch``'s order a function of its number: a ``set_epoch`` sampler or
        iterable dataset (HF ``datasets``' streaming shuffle) is told it, a torch
        ``RandomSampler`` gets a generator seeded with ``seed + epoch``."""
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


def _drop(source: Iterator[Any], count: int) -> int:
    """Draw ``count`` items of ``source`` and drop them; how many there were."""
    dropped = 0
    for _ in itertools.islice(source, max(count, 0)):
        dropped += 1
    return dropped


def _samplers(items: Any) -> list[Any]:
    """The batch sampler, its samplers, and a wrapped one's (accelerate's shard); for a
    loader over an iterable dataset, the dataset too (it may shuffle by epoch)."""
    import torch

    out = [items]
    for name in ("batch_sampler", "sampler"):
        inner = getattr(items, name, None)
        if inner is not None and inner is not items:
            out += _samplers(inner)
    dataset = getattr(items, "dataset", None)
    if isinstance(dataset, torch.utils.data.IterableDataset):
        out.append(dataset)
    return out


class StreamBatches:
    """A batch sampler over a ``Stream`` (or a DataLoader's own passes, _data.py
    ``attach``): each ``iter()`` yields one epoch's worth of kept items, appending each
    one's position to ``stream.handed``; ``took()`` pops them as the loop consumes the
    batches in order."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream

    def __len__(self) -> int:
        return self.stream.epoch_len or 0

    def __iter__(self) -> Iterator[Any]:
        return self.stream.chunk()

    def set_epoch(self, epoch: int) -> None:
        """A framework's epoch is not the data's: the stream sets its own (ignored)."""

    def took(self) -> int:
        """The loop consumed the next batch: its position (the last one, when the loop
        consumed more than was handed out)."""
        return self.stream.took()
