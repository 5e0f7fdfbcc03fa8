"""Gradient and weight distributions from a bounded sample, computed on device.

Every parameter contributes the same ``sample`` elements (1024 by default), picked once
with a seeded generator and cached on the parameter's device, so the cost is flat in the
model size: one gather per parameter, one sort of a (P, sample) matrix, one batched
``searchsorted`` for the histogram. Nothing is copied to the host here; the (P, 8 + bins)
result joins the step's ``StatsPack`` and travels with its one host copy.

Rows: the values at ``QUANTILES`` (min, p1, p25, p50, p75, p95, p99, max) of the sample,
linearly interpolated like ``numpy.quantile``, then ``bins`` counts of the sample between
the row's min and max (equal-width bins; ``decode_rows`` rebuilds the edges from min and
max on the host, so they are not sent from the device).

Tensors with fewer elements than ``sample`` are covered exactly: their indices cycle
through every element (``arange(sample) % numel``), so each row keeps the same width and
the quantiles are those of the whole tensor up to the repetition rounding. Larger tensors
are sampled uniformly with replacement (duplicates are negligible there, and drawing
``sample`` indices costs O(sample), unlike a permutation of the tensor).

A tensor of the 1000 values 0..999, fewer than ``sample``: covered exactly, so its min and
max are the tensor's, and the histogram counts add up to ``sample``::

    >>> dist = Distributions(sample=1024, bins=4)
    >>> rows = dist.measure([torch.arange(1000.0)])   # (P, 8 + bins), on the tensors' device
    >>> rows.shape
    torch.Size([1, 12])
    >>> hist = decode_rows(["fc.weight"], rows.flatten().tolist(), bins=4)["fc.weight"]
    >>> hist["quantiles"][0], hist["quantiles"][-1], hist["edges"]   # after the host copy
    (0.0, 999.0, [0.0, 249.75, 499.5, 749.25, 999.0])
    >>> sum(hist["counts"])
    1024.0
"""

from __future__ import annotations

import torch

QUANTILES: tuple[float, ...] = (0.0, 0.01, 0.25, 0.5, 0.75, 0.95, 0.99, 1.0)
DEFAULT_SAMPLE = 1024
DEFAULT_BINS = 16


class Distributions:
    """Per-parameter quantiles and histograms of a fixed sample (see module docstring).

    One row per tensor, ``width`` numbers each, whatever the tensor's size::

        >>> model = torch.nn.Linear(100, 10)
        >>> model(torch.ones(4, 100)).sum().backward()
        >>> dist = Distributions()
        >>> dist.measure([p.grad for p in model.parameters()]).shape, dist.width
        (torch.Size([2, 24]), 24)
    """

    def __init__(self, sample: int = DEFAULT_SAMPLE, bins: int = DEFAULT_BINS,
                 seed: int = 0) -> None:
        self.sample = max(2, int(sample))
        self.bins = max(1, int(bins))
        self.seed = seed
        # (kind, slot, numel, device) -> sorted indices. Tensors of at most ``sample``
        # elements are enumerated, keyed by size alone, so those of one size share one index
        # tensor; larger ones are drawn, one draw per slot (see ``indices``).
        self._indices: dict[tuple[str, int, int, str], torch.Tensor] = {}
        self._consts: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @property
    def width(self) -> int:
        """Numbers per parameter in a ``measure()`` row."""
        return len(QUANTILES) + self.bins

    def indices(self, slot: int, numel: int, device: torch.device) -> torch.Tensor:
        """The cached sample positions of a tensor of ``numel`` elements."""
        # Large tensors get their own draw per slot (independent samples across layers);
        # small ones are enumerated, which needs no randomness and is shared by size.
        key = ("all", 0, numel, str(device)) if numel <= self.sample else (
            "drawn", slot, numel, str(device))
        idx = self._indices.get(key)
        if idx is None:
            idx = self._indices[key] = self._draw(slot, numel).to(device)
        return idx

    def _draw(self, slot: int, numel: int) -> torch.Tensor:
        if numel <= self.sample:
            return torch.arange(self.sample, dtype=torch.long) % max(numel, 1)
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + slot)
        idx = torch.randint(0, numel, (self.sample,), generator=gen)
        return idx.sort().values  # ascending: the gather walks memory forwards

    def gather(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """(P, sample) float32: one ``take`` per tensor (no copy of the tensor itself)."""
        rows = [torch.take(t, self.indices(i, t.numel(), t.device))
                for i, t in enumerate(tensors)]
        return torch.stack(rows).to(torch.float32)

    @torch.no_grad()
    def measure(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """(P, 8 + bins) float32 on the tensors' device: quantiles, then histogram counts."""
        ordered = self.gather(tensors).sort(dim=1).values
        lo_i, hi_i, frac, grid = self._constants(ordered.device)
        low, high = ordered[:, lo_i], ordered[:, hi_i]
        quantiles = low + (high - low) * frac            # numpy's "linear" interpolation
        vmin, vmax = ordered[:, :1], ordered[:, -1:]
        inner = vmin + (vmax - vmin) * grid               # (P, bins - 1) inner edges
        below = torch.searchsorted(ordered.contiguous(), inner.contiguous())
        n = ordered.shape[1]
        zeros = torch.zeros_like(below[:, :1])
        full = torch.full_like(below[:, :1], n)
        counts = torch.diff(torch.cat([zeros, below, full], dim=1), dim=1)
        return torch.cat([quantiles, counts.to(torch.float32)], dim=1)

    def _constants(self, device: torch.device):
        key = str(device)
        found = self._consts.get(key)
        if found is None:
            pos = torch.tensor(QUANTILES, dtype=torch.float64) * (self.sample - 1)
            lo_i, hi_i = pos.floor().long(), pos.ceil().long()
            frac = (pos - lo_i).to(torch.float32)
            grid = torch.arange(1, self.bins, dtype=torch.float32) / self.bins
            found = self._consts[key] = (lo_i.to(device), hi_i.to(device), frac.to(device),
                                         grid.to(device))
        return found


def decode_rows(names: tuple[str, ...] | list[str], flat: list[float], bins: int) -> dict:
    """Host-side: the flat (P * (8 + bins)) floats as docs/format.md's ``grad_hist`` entries."""
    width = len(QUANTILES) + bins
    out = {}
    for i, name in enumerate(names):
        row = flat[width * i:width * (i + 1)]
        quantiles, counts = row[:len(QUANTILES)], row[len(QUANTILES):]
        lo, hi = quantiles[0], quantiles[-1]
        edges = [lo + (hi - lo) * k / bins for k in range(bins + 1)]
        out[name] = {"edges": edges, "counts": counts, "quantiles": quantiles}
    return out
