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
- Resuming at ``position`` and skipping windows happens at the batch sampler of a
  map-style dataset: the skipped batches' indices are drawn and dropped, never loaded,
  and every other batch keeps its place in the order (a shuffled sampler is not
  re-shuffled by the skip: the dataset's length does not change). Whole epochs inside a
  window are jumped by arithmetic, so a window of any size costs at most one epoch of
  index draws. A streamed source (an ``IterableDataset``, HF ``datasets`` streaming, any
  re-iterable of batches) has no index to leave out: its skipped batches are read past,
  made and dropped (``skips_by``: "sampler" or "reading"; _stream.py).
- Each ``iter()`` yields one epoch's worth, ``len(stream)`` batches, continuing the stream
  (a stretch may span two data epochs once windows were skipped): a framework's epoch
  accounting stays what it was without the skips.

Used three ways: a plain loop wraps its ``DataLoader`` (``DataStream(loader)``) and passes
``data_position=data.position`` to ``log_step`` (``mon.timed(data)`` does it), saves
``data.position`` with its checkpoint and, on a plan, ``data.seek(saved, skip=plan.skip)``;
Lightning takes it as a stateful loader (``state_dict``/``load_state_dict``: its checkpoint
keeps the position, so ``fit(ckpt_path=...)`` resumes the data where the step was, which a
plain DataLoader does not); the HF callback puts the same stream into the Trainer's own
DataLoader (``attach``: its batch sampler, or for an iterable dataset its iteration).

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

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

from monitor_client._stream import Stream, StreamBatches, Window, merge_windows

__all__ = ["DataStream", "StreamBatches", "attach", "merge_windows"]


class DataStream:
    """A loader's batches by data position, resumable at a position, skipping windows (the
    module docstring says how; README "Closing the loop" has the loop).

    ``loader``: a ``torch.utils.data.DataLoader`` over a map-style dataset (skips happen in
    its batch sampler: nothing skipped is loaded, nothing else moves), or a DataLoader over
    an iterable dataset or any re-iterable of batches, one epoch per pass (then skipped
    batches are read past: made and dropped; ``skips_by`` says which). Without a length
    (a stream) it has none either: ``len()`` raises ``TypeError``, as the loader's would,
    and one ``iter()`` runs on across passes until the source runs dry. ``seed``: what a
    shuffled ``RandomSampler``'s order is drawn from, with the epoch.

    ``position`` is the last batch consumed; ``seek(position, skip=plan.skip)`` resumes
    after ``position`` and leaves out the windows (they add up); ``state_dict`` /
    ``load_state_dict`` carry both (Lightning keeps them in its checkpoints)."""

    def __init__(self, loader: Any, *, seed: int = 0) -> None:
        self.loader = loader
        self._batches: StreamBatches | None = None
        sampler = _batch_sampler(loader)
        if sampler is not None:
            self._stream = Stream(sampler, seed, sampler=True)
            self._batches = StreamBatches(self._stream)
            self._iterable: Any = _sibling(loader, self._batches)
        else:
            self._stream = Stream(loader, seed)
            self._iterable = None
        # A framework that prefetches (Lightning does, for a loader without a length)
        # reports consumption itself (``took``); a plain loop consumes as it is handed a
        # batch.
        self.reported = False

    @property
    def position(self) -> int:
        """The last data position consumed (0 before any)."""
        return self._stream.position

    @property
    def skip(self) -> tuple[Window, ...]:
        return self._stream.windows

    @property
    def skips_by(self) -> str:
        """How a window is left out: "sampler" (a map-style dataset's batch sampler, nothing
        loaded) or "reading" (a stream: its batches are read past)."""
        return self._stream.skips_by

    def seek(self, position: int, skip: Iterable[Iterable[int]] = ()) -> None:
        """Resume after ``position``; never yield a position inside ``skip``'s windows
        (inclusive, added to the ones already skipped)."""
        self._stream.seek(position, skip)

    def add_skip(self, skip: Iterable[Iterable[int]]) -> None:
        """Leave ``skip``'s windows out too, from wherever the stream is (a framework that
        restored the position itself: Lightning's ``load_state_dict``)."""
        self._stream.windows = merge_windows([*self._stream.windows, *skip])

    def __len__(self) -> int:
        length = self._stream.epoch_len
        if length is None:
            raise TypeError("a DataStream over a source without a length has none")
        return length

    def __iter__(self) -> Iterator[Any]:
        batches = self._iterable if self._iterable is not None else self._stream.chunk()
        for batch in batches:
            if not self.reported:
                self.took()
            yield batch

    def took(self) -> int:
        """The loop consumed the next batch handed out: its position (a framework that
        prefetches calls it as it consumes, with ``reported`` set)."""
        return self._stream.took()

    @property
    def fetched_ahead(self) -> int:
        """Batches handed out and not consumed yet (a framework's prefetch)."""
        return len(self._stream.handed)

    def report_consumption(self) -> None:
        """From now on the caller says when it consumes a batch (``took``): a framework that
        fetches ahead (Lightning does, for a loader without a length) and says so once
        it is about to train, maybe after it fetched: what it fetched since the stream was
        sought or restored is handed out, not consumed."""
        if not self.reported:
            self.reported = True
            self._stream.unconsume()

    def state_dict(self) -> dict[str, Any]:
        stream = self._stream
        return {"position": stream.position, "skip": [list(w) for w in stream.windows],
                "chunk_done": stream.chunk_done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Where a checkpoint left the data; windows already set (a plan's) are kept."""
        self._stream.seek(int(state.get("position", 0)), state.get("skip") or (),
                          int(state.get("chunk_done", 0)))


def attach(loader: Any, position: int = 0, skip: Iterable[Iterable[int]] = (),
           seed: int = 0) -> StreamBatches | None:
    """Make ``loader`` (a DataLoader, or accelerate's wrapper of one, as the HF Trainer
    builds it) yield a stream resumed after ``position`` and leaving ``skip`` out, in
    place: over a map-style dataset its batch sampler becomes a ``StreamBatches``; over an
    iterable dataset its iteration reads its own passes through one (skipped batches read
    past). None when it is neither (nothing can be counted there)."""
    base = _base(loader)
    sampler = _batch_sampler(base)
    if sampler is not None:
        stream = Stream(sampler, seed, sampler=True)
    elif _iterable_loader(base):
        stream = Stream(_Passes(base, type(base)), seed)
    else:
        return None
    stream.seek(position, skip)
    batches = StreamBatches(stream)
    if sampler is not None:
        # DataLoader refuses to set batch_sampler after it is built; its iterators read it
        # afresh at each iter(), so the instance attribute is all there is to change.
        object.__setattr__(base, "batch_sampler", batches)
    else:
        object.__setattr__(base, "_monitor_batches", batches)
        object.__setattr__(base, "__class__", _streamed(type(base)))
    return batches


class _Passes:
    """A DataLoader's own passes (``cls.__iter__``: its class's before ``attach``), what a
    stream over an iterable dataset reads; ``len`` as the loader's (none for a stream)."""

    def __init__(self, loader: Any, cls: Any) -> None:
        self.loader, self.cls = loader, cls
        self.dataset = loader.dataset  # a set_epoch dataset is told the pass (_stream.py)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        return self.cls.__iter__(self.loader)


_STREAMED: dict[type, type] = {}


def _streamed(cls: type) -> type:
    """``cls`` iterating its ``_monitor_batches`` (``attach``): a subclass, so whoever
    iterates the loader, ``iter()`` or accelerate's ``base_dataloader.__iter__()``, gets
    the stream."""
    if cls not in _STREAMED:
        def __iter__(self: Any) -> Iterator[Any]:  # noqa: N807 - the loader's iteration
            return iter(self._monitor_batches)

        _STREAMED[cls] = type(f"Streamed{cls.__name__}", (cls,), {"__iter__": __iter__})
    return _STREAMED[cls]


def _iterable_loader(loader: Any) -> bool:
    """Whether ``loader`` is a DataLoader over an iterable dataset."""
    import torch

    return isinstance(loader, torch.utils.data.DataLoader) and isinstance(
        loader.dataset, torch.utils.data.IterableDataset)


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
