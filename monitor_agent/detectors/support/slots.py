"""Per-name state as numpy arrays: a stable slot per name, and arrays grown as names arrive.

Layers (``DetectorContext``), activation modules (``dead_units``, ``activation_blowup``) and
gradient-distribution parameters (``grad_distribution``) all keep per-name history in
arrays indexed by a slot the name keeps for the whole run. ``SlotIndex`` hands out the
slots, first come first served, appending to a names list the caller's snapshot state
owns; a ``cap`` bounds it, so a record full of made-up names cannot grow detector memory
without bound. ``grown`` extends an array (any rank, along its first axis) when new slots
appeared.

Two records whose columns come in different orders, one new name, and a cap of three::

    >>> names = []  # what the caller's snapshot keeps
    >>> index = SlotIndex(names, cap=3)
    >>> index.of(("a", "b")).tolist(), index.of(("c", "a", "d")).tolist(), names
    ([0, 1], [2, 0, -1], ['a', 'b', 'c'])
    >>> grown(np.zeros(2, dtype=np.int64), len(names), 7).tolist()
    [0, 0, 7]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_MODULES = 1024


def grown(arr: np.ndarray, size: int, fill: float | int | bool) -> np.ndarray:
    """``arr`` extended along its first axis to ``size`` rows of ``fill`` (new slots)."""
    if len(arr) >= size:
        return arr
    extra = np.full((size - len(arr), *arr.shape[1:]), fill, dtype=arr.dtype)
    return np.concatenate((arr, extra))


class SlotIndex:
    """Name -> slot over ``names`` (which it appends to), at most ``cap`` names."""

    def __init__(self, names: list[str], cap: int | None = None) -> None:
        self.names = names
        self.cap = cap
        self._index = {n: i for i, n in enumerate(names)}

    def slot(self, name: str) -> int:
        """``name``'s slot, a new one if it has none; -1 when it has none and the cap is hit."""
        slot = self._index.get(name)
        if slot is None:
            if self.cap is not None and len(self.names) >= self.cap:
                return -1
            slot = self._index[name] = len(self.names)
            self.names.append(name)
        return slot

    def of(self, names: tuple[str, ...]) -> np.ndarray:
        """The slot of each of ``names`` (see ``slot``), as an index array."""
        return np.fromiter((self.slot(n) for n in names), dtype=np.intp, count=len(names))


@dataclass(slots=True)
class ModuleSlots:
    """The activation detectors' module slots: ``names`` is what their snapshot keeps."""

    names: list[str] = field(default_factory=list)

    def align(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        """The columns of ``names`` that have a slot, and their slots."""
        slots = SlotIndex(self.names, MAX_MODULES).of(names)
        cols = np.flatnonzero(slots >= 0)
        return cols.astype(np.intp), slots[cols]

    def __len__(self) -> int:
        return len(self.names)
