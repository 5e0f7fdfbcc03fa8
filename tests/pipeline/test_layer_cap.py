"""The cap on layer names per run (pipeline/layer_cap.py): the first names a run sends are
judged, later new ones are dropped from detection and counted, and the stored record keeps
every layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from prometheus_client import CollectorRegistry

from monitor_agent.metrics.sidecar import SelfMetrics
from monitor_agent.pipeline.engine import Engine, Incoming
from monitor_agent.pipeline.layer_cap import cap_layers
from monitor_agent.records import schemas, wire
from monitor_agent.records.types import StepRecord
from monitor_agent.settings import load_settings
from monitor_agent.storage.store import Store


def _step(step: int, grads: dict[str, float]) -> dict:
    return {"kind": "step", "run_id": "r", "step": step, "time": float(step), "loss": 2.0,
            "layers": {name: {"grad_norm": g} for name, g in grads.items()}}


def _record(step: int, grads: dict[str, float]) -> StepRecord:
    record = schemas.parse_record(_step(step, grads))
    assert isinstance(record, StepRecord)
    return record


def _grads(record: StepRecord) -> dict[str, float]:
    assert record.layers is not None
    return dict(zip(record.layers.names, record.layers.stats["grad_norm"].tolist(),
                    strict=True))


def test_the_layers_kept_keep_their_own_values():
    known: set[str] = set()
    capped, dropped = cap_layers(_record(1, {"embed": 1.0, "attn": 2.0, "mlp": 3.0}),
                                 known, cap=2)
    assert dropped == 1
    assert _grads(capped) == {"embed": 1.0, "attn": 2.0}
    # A later record naming a dropped layer first: the kept ones are not shifted onto it.
    capped, dropped = cap_layers(_record(2, {"mlp": 30.0, "head": 40.0, "attn": 20.0}),
                                 known, cap=2)
    assert dropped == 2
    assert _grads(capped) == {"attn": 20.0}
    assert known == {"embed", "attn"}


def test_under_the_cap_the_record_is_left_whole():
    known = {"embed"}
    record = _record(1, {"embed": 1.0, "attn": 2.0})
    capped, dropped = cap_layers(record, known, cap=2)
    assert capped is record and dropped == 0
    assert known == {"embed", "attn"}


def test_the_engine_judges_the_first_names_stores_every_layer_and_counts_the_rest(
        tmp_path: Path):
    registry = CollectorRegistry()
    engine = Engine(load_settings(data_dir=tmp_path, max_layer_names_per_run=2),
                    Store(tmp_path / "monitor.sqlite"), SelfMetrics(registry, "test"))
    grads = {"embed": 1.0, "attn": 2.0, "mlp": 3.0}
    for step in (1, 2):
        result = engine.ingest([Incoming(0, *schemas.parse_for_store(_step(step, grads)))],
                               now=float(step))
        assert result.accepted == 1
    assert engine.registry.get("r").state.layer_names == {"embed", "attn"}
    assert registry.get_sample_value("monitor_agent_dropped_series_total",
                                     {"reason": "max_layer_names"}) == 2
    stored = [wire.loads(body) for body in engine.store.records("r")]
    assert [sorted(s["layers"]) for s in stored] == [["attn", "embed", "mlp"]] * 2
    assert np.isclose(stored[0]["layers"]["mlp"]["grad_norm"], 3.0)
