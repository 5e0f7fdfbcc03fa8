"""Which NDJSON lines are stored as sent: only those holding known fields, once each."""

from __future__ import annotations

import orjson
import pytest

from monitor_agent.api.verbatim import verbatim_ok
from monitor_agent.records import wire

STEP = {"kind": "step", "run_id": "r", "step": 3, "time": 1.5, "loss": "NaN",
        "layers": {"a.weight": {"grad_norm": 1.0, "grad_none": False}},
        "grad_hist": {"a.weight": {"edges": [0.0, 1.0], "counts": [3.0]}},
        "memory": {"allocated_bytes": 10.0}, "gpu": {"util": 0.5}}
RUN = {"kind": "run", "run_id": "r", "config": {"lr": 0.1, "opt": {"betas": [0.9, 0.99]}},
       "labels": {"team": "x"}}


@pytest.mark.parametrize("rec", [STEP, RUN])
def test_a_clean_client_line_is_kept(rec):
    raw = orjson.dumps(rec)
    assert verbatim_ok(wire.loads(raw), raw)


@pytest.mark.parametrize("raw", [
    orjson.dumps({**STEP, "junk": 1}),
    orjson.dumps({**STEP, "layers": {"a": {"grad_norm": 1.0, "junk": 1}}}),
    orjson.dumps({**STEP, "memory": {"junk": 1}}),
    orjson.dumps({**STEP, "grad_hist": {"a": {"edges": [0.0], "counts": [], "junk": 1}}}),
    orjson.dumps(STEP)[:-1] + b',"loss":"' + b"x" * 10_000 + b'","loss":1.0}',  # duplicate
    orjson.dumps({**STEP, "run_id": 'r":"x'}),  # counts differ: re-serialise, to be safe
    orjson.dumps({**STEP, "run_id": "r:x"}),  # a colon in a value: re-serialise, to be safe
])
def test_unknown_duplicate_or_odd_lines_are_reserialised(raw):
    assert not verbatim_ok(wire.loads(raw), raw)
