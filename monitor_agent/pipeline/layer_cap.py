"""The cap on layer names per run, applied to what detectors see (the record is stored whole).

A run that sends ever-new layer names (a bug, or a hostile client) would otherwise grow
every per-layer detector state without bound; names beyond ``max_layer_names_per_run`` are
dropped from detection and counted (``monitor_agent_dropped_series_total{reason=
"max_layer_names"}``).

A run capped at two names sends three layers; the third is dropped from detection, and
``known`` (the run's ``RunState.layer_names``) remembers the two kept::

    >>> from monitor_agent.records.schemas import parse_record
    >>> layers = {name: {"grad_norm": 1.0} for name in ("embed", "attn", "mlp")}
    >>> record = parse_record({"kind": "step", "run_id": "r1", "step": 1, "time": 1.0,
    ...                        "layers": layers})
    >>> known = set()
    >>> capped, dropped = cap_layers(record, known, cap=2)
    >>> capped.layers.names, dropped, sorted(known)
    (('embed', 'attn'), 1, ['attn', 'embed'])
"""

from __future__ import annotations

import dataclasses

import numpy as np

from monitor_agent.records.types import LayerTable, StepRecord


def cap_layers(record: StepRecord, known: set[str], cap: int) -> tuple[StepRecord, int]:
    """The record with only the layers among the run's first ``cap`` names (``known``
    grows here), and how many layers it lost."""
    table = record.layers
    if table is None:
        return record, 0
    if len(known) + len(table) <= cap or known.issuperset(table.names):
        known.update(table.names)
        return record, 0
    keep = []
    for i, name in enumerate(table.names):
        if name not in known and len(known) < cap:
            known.add(name)
        if name in known:
            keep.append(i)
    dropped = len(table) - len(keep)
    if dropped:
        record = dataclasses.replace(record, layers=_take(table, keep))
    return record, dropped


def _take(table: LayerTable, keep: list[int]) -> LayerTable:
    idx = np.asarray(keep, dtype=np.intp)
    return LayerTable(names=tuple(table.names[i] for i in keep),
                      stats={k: v[idx] for k, v in table.stats.items()},
                      measured={k: v[idx] for k, v in table.measured.items()},
                      grad_none=table.grad_none[idx])
