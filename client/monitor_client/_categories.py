"""Per-category eval loss, normalised per sample, accumulated on device.

A validation set that mixes sources (code, prose, maths; languages; tasks) hides a
category going bad inside the mean. ``CategoryLoss`` keeps one mean per category and sends
it as ``metrics["loss/<category>"]``, which the sidecar exposes as
``training_category_loss{category=...}`` and the ``category_divergence`` detector watches.

Each sample counts once, whatever its length: its loss is the mean over its own tokens,
and a category's loss is the mean over its samples. Token-weighting instead would let a
category of short samples look easy (or hard) just because it contributes few tokens.

Statistics stay on the device until ``metrics()``, which makes one host copy.

In an eval loop, ``tok = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")``
gives the (B, T) per-token losses of a batch, ``cats.add(tok, categories, mask=y != PAD)``
adds them, and after the loop ``mon.log_eval(step, val_loss=cats.overall(),
metrics=cats.metrics())`` sends them. Two code samples and one prose sample, padding
masked; the short code sample counts as much as the long one::

    >>> import torch
    >>> cats = CategoryLoss()
    >>> tok = torch.tensor([[1.0, 3.0, 9.0], [2.0, 9.0, 9.0], [4.0, 4.0, 4.0]])  # (B, T)
    >>> mask = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 1]])                   # 0: padding
    >>> cats.add(tok, ["code", "code", "prose"], mask=mask)
    >>> cats.metrics(), cats.overall()
    ({'loss/code': 2.0, 'loss/prose': 4.0}, 2.666...)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PREFIX = "loss/"
MAX_CATEGORIES = 64  # the sidecar exposes at most this many per run by default


class CategoryLoss:
    """Running per-category mean of per-sample losses (see the module docstring)."""

    def __init__(self, max_categories: int = MAX_CATEGORIES) -> None:
        self.max_categories = max_categories
        self._index: dict[str, int] = {}
        self._sums: Any = None      # device tensor (K,), float64 so long evals do not drift
        self._counts: Any = None    # device tensor (K,)
        self.dropped = 0            # samples whose category was past the cap

    def add(self, losses: Any, categories: Sequence[Any], mask: Any = None) -> None:
        """``losses``: per-token (B, T) or per-sample (B,) losses; ``categories``: B labels;
        ``mask``: (B, T), true/1 where a token counts (padding excluded)."""
        import torch

        per_sample = _per_sample(losses.detach(), mask)
        rows, idx = [], []
        for row, name in enumerate(categories):
            slot = self._slot(str(name))
            if slot is None:
                self.dropped += 1
                continue
            rows.append(row)
            idx.append(slot)
        if not rows:
            return
        device = per_sample.device
        values = per_sample[torch.tensor(rows, device=device)].to(torch.float64)
        slots = torch.tensor(idx, device=device)
        self._grow(len(self._index), device)
        self._sums.index_add_(0, slots, values)
        self._counts.index_add_(0, slots, torch.ones_like(values))

    def _slot(self, name: str) -> int | None:
        slot = self._index.get(name)
        if slot is None and len(self._index) < self.max_categories:
            slot = self._index[name] = len(self._index)
        return slot

    def _grow(self, size: int, device: Any) -> None:
        import torch

        have = 0 if self._sums is None else self._sums.numel()
        if have >= size:
            return
        pad = torch.zeros(size - have, dtype=torch.float64, device=device)
        self._sums = pad if self._sums is None else torch.cat([self._sums, pad])
        self._counts = pad.clone() if self._counts is None else torch.cat([self._counts, pad])

    def metrics(self) -> dict[str, float]:
        """``{"loss/<category>": mean}``: ONE device-to-host copy."""
        if self._sums is None:
            return {}
        sums, counts = self._sums.tolist(), self._counts.tolist()  # sync point
        return {f"{PREFIX}{name}": sums[i] / counts[i]
                for name, i in self._index.items() if counts[i] > 0}

    def overall(self) -> float | None:
        """Mean over every sample (each sample once), for ``val_loss``."""
        if self._sums is None:
            return None
        import torch

        total, count = torch.stack([self._sums.sum(), self._counts.sum()]).tolist()  # sync
        return total / count if count else None

    def reset(self) -> None:
        self._index.clear()
        self._sums = self._counts = None
        self.dropped = 0


def _per_sample(losses: Any, mask: Any) -> Any:
    if losses.dim() == 1:
        return losses.float()
    flat = losses.float().reshape(losses.shape[0], -1)
    if mask is None:
        return flat.mean(dim=1)
    weight = mask.reshape(flat.shape).to(flat.dtype)
    return (flat * weight).sum(dim=1) / weight.sum(dim=1).clamp(min=1.0)
