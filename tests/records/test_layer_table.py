"""``LayerTable.from_mapping``: a step's per-parameter statistics as columns, whatever mix
of complete rows, missing statistics, nulls and non-finite values the record holds."""

from __future__ import annotations

import math

import numpy as np

from monitor_agent.records.types import LAYER_STATS, LayerTable


def test_complete_rows_missing_stats_nulls_and_nonfinite_values_are_told_apart():
    full = {s: float(k + 1) for k, s in enumerate(LAYER_STATS)}
    table = LayerTable.from_mapping({
        "a": full,
        "b": {"grad_norm": 2.0, "param_norm": None},  # most statistics not sent
        "c": {**full, "grad_norm": math.nan, "update_norm": math.inf},  # data, not gaps
        "d": {**full, "grad_mean": None, "grad_none": True},
        "e": {},
    })
    assert table.names == ("a", "b", "c", "d", "e")
    assert table.stats["grad_norm"][:2].tolist() == [1.0, 2.0]
    assert math.isnan(table.stats["grad_norm"][2]) and table.measured["grad_norm"][2]
    assert table.stats["update_norm"][2] == math.inf and table.measured["update_norm"][2]
    assert table.measured["grad_norm"].tolist() == [True, True, True, True, False]
    assert table.measured["param_norm"].tolist() == [True, False, True, True, False]
    assert table.measured["grad_mean"].tolist() == [True, False, True, False, False]
    assert table.grad_none.tolist() == [False, False, False, True, False]
    assert table.row("a") == full
    assert table.row("b") == {s: (2.0 if s == "grad_norm" else None) for s in LAYER_STATS}


def test_the_columns_are_float_arrays_of_the_rows():
    rows = {f"l{i}": {s: i + k / 10 for k, s in enumerate(LAYER_STATS)} for i in range(50)}
    table = LayerTable.from_mapping(rows)
    for k, s in enumerate(LAYER_STATS):
        assert table.stats[s].dtype == np.float64
        assert table.stats[s].tolist() == [i + k / 10 for i in range(50)]
        assert table.measured[s].all()
