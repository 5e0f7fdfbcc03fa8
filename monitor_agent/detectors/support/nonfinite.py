"""Which parameters of a step carry a non-finite statistic, in backward order.

Shared by ``nan_inf`` (the origin of a NaN) and ``loss_scale_collapse`` (the parameters
behind a run of overflow steps). Backward order is the run's ``layer_order`` reversed:
a NaN born in the backward pass reaches the input side and leaves the output side finite,
so the first listed is where it appeared.

A step whose gradient went NaN in the backward pass at ``h.1`` of four blocks (the run
record lists them input to output)::

    >>> from monitor_agent.detectors import DetectorSettings
    >>> from monitor_agent.records.schemas import parse_record
    >>> ctx = DetectorContext(DetectorSettings())
    >>> order = ["h.0.weight", "h.1.weight", "h.2.weight", "h.3.weight"]
    >>> ctx.observe(parse_record({"kind": "run", "run_id": "r", "model": {"layer_order": order}}))
    >>> norms = dict(zip(order, ["NaN", "NaN", 0.4, 0.2]))
    >>> step = parse_record({"kind": "step", "run_id": "r", "step": 7, "time": 7,
    ...                      "grad_norm": "NaN", "grad_norms": norms})
    >>> nonfinite_params(ctx, step)
    ['h.1.weight', 'h.0.weight']
"""

from __future__ import annotations

import numpy as np

from monitor_agent.detectors.support.context import DetectorContext
from monitor_agent.records.types import LayerTable, StepRecord

_LAYER_STATS = ("grad_norm", "param_norm", "update_norm")


def nonfinite_params(ctx: DetectorContext, rec: StepRecord) -> list[str]:
    """Non-finite parameters in backward order: output side first (see module docstring)."""
    table = rec.layer_grads
    if table is None:
        return []
    view = ctx.align(table)
    mask = nonfinite_mask(table)
    if mask is None:
        return []
    ordered = [int(c) for c in view.order[::-1] if mask[c]]
    rest = [int(c) for c in np.flatnonzero(mask) if c not in set(ordered)]
    return [table.names[c] for c in ordered + rest]


def nonfinite_mask(table: LayerTable) -> np.ndarray | None:
    """Parameters with a non-finite measured statistic; None when there are none."""
    mask = np.zeros(len(table), dtype=bool)
    for stat in _LAYER_STATS:
        mask |= ~np.isfinite(table.stats[stat]) & table.measured[stat]
    return mask if mask.any() else None
