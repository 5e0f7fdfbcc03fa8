"""The wire edge: a validated model becomes its ``types`` dataclass by one generic copy
(``types.from_wire``), and the JSON the store keeps is the model's own."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from monitor_agent.records import schemas, wire
from monitor_agent.records import types as t

MODELS = {"run": schemas.RunModel, "step": schemas.StepModel, "eval": schemas.EvalModel,
          "end": schemas.EndModel}
QUANTILES = [-1.0, -0.9, -0.2, 0.0, 0.2, 0.6, 0.9, 1.0]


@pytest.mark.parametrize("kind", sorted(MODELS))
def test_every_wire_field_reaches_the_dataclass(kind: str):
    # A field added to a model but not to its dataclass would be validated, then dropped.
    fields = dataclasses.fields(t.RECORD_TYPES[kind])
    reached = {f.name for f in fields} | {f.metadata.get("wire_source") for f in fields}
    assert set(MODELS[kind].model_fields) <= reached


def test_a_full_step_converts_every_structured_field():
    obj = {
        "kind": "step", "run_id": "r", "step": 7, "time": 1.5, "loss": "NaN", "lr": 1e-3,
        "memory": {"device": "cuda:0", "allocated_bytes": 1e9},
        "gpu": {"util": 0.9},
        "layers": {"w": {"grad_norm": 0.5, "grad_none": False}, "b": {"grad_none": True}},
        "grad_hist": {"w": {"edges": [0.0, 1.0], "counts": [3.0], "quantiles": QUANTILES}},
        "activations": {"mlp.act": {"mean": 0.1, "max_abs": 3.0}},
        "grad_norms": {"w": "Infinity"},
        "nonfinite_modules": ["mlp.act"], "nonfinite_module_count": 1,
    }
    rec = schemas.parse_record(obj)
    assert isinstance(rec, t.StepRecord)
    assert math.isnan(rec.loss) and rec.lr == 1e-3 and rec.skipped is False
    assert rec.memory == t.Memory(device="cuda:0", allocated_bytes=1e9)
    assert rec.gpu == {"util": 0.9}
    assert rec.layers is not None and rec.layers.names == ("w", "b")
    assert rec.layers.grad_none.tolist() == [False, True]
    assert rec.layers.row("w")["grad_norm"] == 0.5 and rec.layers.row("b")["grad_norm"] is None
    assert rec.grad_hist == obj["grad_hist"] and rec.param_hist is None
    assert rec.grad_quantiles is not None and rec.grad_quantiles.values.tolist() == [QUANTILES]
    assert rec.param_quantiles is None
    assert rec.activations is not None and rec.activations.stats["max_abs"].tolist() == [3.0]
    assert rec.grad_norms is not None and np.isinf(rec.grad_norms.stats["grad_norm"][0])
    assert rec.nonfinite_modules == ("mlp.act",) and rec.nonfinite_module_count == 1


def test_empty_and_null_wire_values_leave_the_dataclass_defaults():
    rec = schemas.parse_record({"kind": "step", "run_id": "r", "step": 1, "time": 0.0,
                                "gpu": {}, "layers": {}, "skipped": None,
                                "nonfinite_modules": []})
    assert isinstance(rec, t.StepRecord)
    assert (rec.gpu, rec.layers, rec.nonfinite_modules, rec.skipped) == (None, None, None, False)
    assert rec == t.StepRecord(run_id="r", step=1, time=0.0)


@pytest.mark.parametrize("obj, expected", [
    ({"kind": "run", "run_id": "r", "labels": {"team": "nlp"}, "config": {"lr": 1}},
     t.RunRecord(run_id="r", labels={"team": "nlp"}, config={"lr": 1})),
    ({"kind": "eval", "run_id": "r", "step": 3, "time": 2.0, "metrics": {"acc": 0.5}},
     t.EvalRecord(run_id="r", step=3, time=2.0, metrics={"acc": 0.5})),
    ({"kind": "end", "run_id": "r", "time": 9.0, "status": "failed", "error": "OOM"},
     t.EndRecord(run_id="r", step=0, time=9.0, status="failed", error="OOM")),
])
def test_other_kinds_convert_field_by_field(obj: dict, expected: t.Record):
    assert schemas.parse_record(obj) == expected


def test_the_stored_json_keeps_only_defined_fields_without_nulls():
    obj = {"kind": "step", "run_id": "r", "step": 1, "time": 0.0, "loss": float("inf"),
           "lr": None, "surprise": "dropped"}
    record, body = schemas.parse_for_store(obj)
    assert body == schemas.stored_json(schemas.validate(obj))
    assert wire.loads(body) == {"kind": "step", "run_id": "r", "step": 1, "time": 0.0,
                                "rank": 0, "loss": "Infinity"}
    assert record == schemas.parse_record(obj)


def test_top_level_numbers_of_a_step_are_the_scripts_own_scalars():
    base = {"kind": "step", "run_id": "r", "step": 1, "time": 0.0, "loss": 1.0}
    obj = {**base, "accuracy": 0.5, "ppl": "NaN", "tokens_seen": 12, "metrics": {"bleu": 3.0},
           "flag": True, "note": "text", "nested": {"a": 1.0}, "huge": 2**60,
           "bad\tname": 1.0}
    record, body = schemas.parse_for_store(obj)
    assert record.metrics is not None and set(record.metrics) == {
        "accuracy", "ppl", "tokens_seen", "bleu"}
    assert math.isnan(record.metrics["ppl"]) and record.metrics["tokens_seen"] == 12.0
    stored = wire.loads(body)
    assert "accuracy" not in stored and stored["metrics"]["accuracy"] == 0.5
    assert not {"flag", "note", "nested", "huge", "bad\tname"} & set(stored)
    # the metrics map keeps what was sent there, and its budget holds
    assert schemas.parse_record({**base, "acc": 1.0, "metrics": {"acc": 2.0}}).metrics == {
        "acc": 2.0}
    many = schemas.parse_record({**base, **{f"m{i}": 1.0 for i in range(600)}})
    assert many.metrics is not None and len(many.metrics) == schemas.MAX_METRICS


def test_a_bad_record_is_refused_before_conversion():
    with pytest.raises(schemas.RecordError, match="step"):
        schemas.parse_for_store({"kind": "step", "run_id": "r", "step": -1, "time": 0.0})
