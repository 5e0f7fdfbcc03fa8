"""Stable per-module slots for the activation detectors (``dead_units``, ``activation_blowup``).

A step's ``activations`` table names modules; each detector keeps its per-module history in
numpy arrays indexed by a slot that a module keeps for the whole run. The number of slots is
capped, so a record full of made-up module names cannot grow detector memory without bound.

Example::

    slots = ModuleSlots()
    cols, idx = slots.align(table.names)   # table columns that have a slot, and their slots
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

MAX_MODULES = 1024


@dataclass(slots=True)
class ModuleSlots:
    """Module name -> slot, first come first served, at most ``MAX_MODULES``."""

    names: list[str] = field(default_factory=list)

    def align(self, names: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
        index = {n: i for i, n in enumerate(self.names)}
        cols, slots = [], []
        for c, name in enumerate(names):
            slot = index.get(name)
            if slot is None and len(self.names) < MAX_MODULES:
                slot = index[name] = len(self.names)
                self.names.append(name)
            if slot is not None:
                cols.append(c)
                slots.append(slot)
        return np.array(cols, dtype=np.intp), np.array(slots, dtype=np.intp)

    def __len__(self) -> int:
        return len(self.names)


def grown_rows(arr: np.ndarray, rows: int, fill: float) -> np.ndarray:
    """A 2-D per-slot history extended to ``rows`` rows of ``fill``."""
    if arr.shape[0] >= rows:
        return arr
    extra = np.full((rows - arr.shape[0], arr.shape[1]), fill, dtype=arr.dtype)
    return np.concatenate((arr, extra))
