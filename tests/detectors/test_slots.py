"""support/slots.py: stable per-name slots with a cap, and arrays grown as slots appear."""

from __future__ import annotations

import numpy as np

from monitor_agent.detectors.support.slots import ModuleSlots, SlotIndex, grown


def test_slots_are_stable_first_come_first_served_and_extend_the_names_list():
    names: list[str] = []
    index = SlotIndex(names)
    assert index.of(("b", "a")).tolist() == [0, 1]
    assert index.of(("a", "c", "b", "c")).tolist() == [1, 2, 0, 2]
    assert names == ["b", "a", "c"]
    # Rebuilt from the names a snapshot kept: the same slots.
    assert SlotIndex(list(names)).of(("c", "b", "a")).tolist() == [2, 0, 1]


def test_past_the_cap_a_name_gets_no_slot_and_nothing_grows():
    names: list[str] = []
    index = SlotIndex(names, cap=2)
    assert index.of(("a", "b", "c")).tolist() == [0, 1, -1]
    assert index.slot("d") == -1 and index.slot("a") == 0
    assert names == ["a", "b"]


def test_module_slots_align_returns_only_columns_with_a_slot():
    slots = ModuleSlots(names=[f"m{i}" for i in range(1023)])
    cols, idx = slots.align(("x", "m5", "y"))
    assert cols.tolist() == [0, 1] and idx.tolist() == [1023, 5]
    assert len(slots) == 1024


def test_grown_extends_the_first_axis_with_fill_and_keeps_dtype():
    a = grown(np.array([1, 2], dtype=np.int64), 4, 0)
    assert a.tolist() == [1, 2, 0, 0] and a.dtype == np.int64
    b = grown(np.zeros((1, 3)), 3, np.nan)
    assert b.shape == (3, 3) and np.isnan(b[1:]).all() and (b[0] == 0).all()
    c = grown(np.ones((2, 2, 3)), 3, np.nan)
    assert c.shape == (3, 2, 3) and np.isnan(c[2]).all()
    same = np.ones(5)
    assert grown(same, 3, 0.0) is same
