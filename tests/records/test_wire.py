"""docs/format.md's number rules and record validation at the edge."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import pytest

from monitor_agent.records import schemas, wire
from monitor_agent.records.types import StepRecord


def test_loads_accepts_bare_tokens_and_dumps_writes_strings():
    obj = wire.loads(b'{"a": NaN, "b": [Infinity, -Infinity], "c": "NaN"}')
    assert math.isnan(obj["a"]) and obj["b"] == [math.inf, -math.inf] and obj["c"] == "NaN"
    assert wire.dumps({"a": math.nan, "b": [math.inf, -math.inf]}) == (
        b'{"a":"NaN","b":["Infinity","-Infinity"]}'
    )


def test_iter_trace_reads_plain_and_gzip(tmp_path: Path):
    lines = b'{"kind":"end","run_id":"r","time":1}\n\n{"kind":"end","run_id":"s","time":2}\n'
    (tmp_path / "a.jsonl").write_bytes(lines)
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(lines))
    for name in ("a.jsonl", "a.jsonl.gz"):
        assert [o["run_id"] for o in wire.iter_trace(tmp_path / name)] == ["r", "s"]


def test_iter_trace_names_the_bad_line(tmp_path: Path):
    (tmp_path / "bad.jsonl").write_bytes(b'{"kind":"end"}\n{oops\n')
    with pytest.raises(ValueError, match=":2:"):
        list(wire.iter_trace(tmp_path / "bad.jsonl"))


def test_non_finite_strings_become_floats():
    rec = schemas.parse_record({"kind": "step", "run_id": "r", "step": 3, "time": 1.0,
                                "loss": "NaN", "grad_norm": "Infinity",
                                "layers": {"w": {"grad_norm": "-Infinity"}}})
    assert isinstance(rec, StepRecord)
    assert math.isnan(rec.loss) and rec.grad_norm == math.inf
    assert rec.layers.stats["grad_norm"][0] == -math.inf


def test_every_public_trace_validates(traces_dir: Path):
    traces = sorted(traces_dir.glob("*.jsonl.gz"))
    assert traces, traces_dir
    for path in traces:
        kinds = {schemas.validate(o).kind for o in wire.iter_trace(path)}
        assert {"run", "step"} <= kinds, path.name


@pytest.mark.parametrize("obj", [
    {"kind": "step", "run_id": "r", "step": 1, "time": 1, "layers": {f"l{i}": {} for i in range(20_001)}},
    {"kind": "step", "run_id": "x" * 201, "step": 1, "time": 1},
    {"kind": "run", "run_id": "r", "labels": {"bad-name": "v"}},
    {"kind": "step", "run_id": "r", "step": 2**60, "time": 1},
])
def test_limits(obj):
    with pytest.raises(schemas.RecordError):
        schemas.validate(obj)


@pytest.mark.parametrize("obj", [
    {"loss": math.nan, "g": [math.inf, -math.inf, 1.5e-300], "note": "NaN, -Infinity"},
    {'k"NaN\\': [math.nan], "s": 'x\\"Infinity', "Infinity": -math.inf, "u": "\u00e9 NaN"},
    {"layers": {f"NaN{i}": {"grad_norm": math.nan if i % 2 else 1.0} for i in range(50)}},
])
def test_stored_to_wire_reads_as_dumps_would_write_it(obj):
    import json

    for stored in (json.dumps(obj).encode(), json.dumps(obj, separators=(",", ":")).encode()):
        answer = wire.stored_to_wire(stored)
        assert json.loads(answer) == json.loads(wire.dumps(wire.loads(stored)))
