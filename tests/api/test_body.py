"""The request-body layer (api/body.py): the values budget of an NDJSON body.

Lines far under the budget are not counted byte by byte; where their lengths could pass
it, the count is made exact, so the 413 comes on the line whose values pass the budget and
names their exact number, and a body of many bytes but few values is never refused.
"""

from __future__ import annotations

import json

import pytest

from monitor_agent.api.body import BadRequest, Line, count_values, decode
from monitor_agent.settings import Settings

NDJSON = {"content-type": "application/x-ndjson"}
LIMIT = 1000


def _line(step: int, numbers: int) -> bytes:
    rec = {"kind": "step", "run_id": "r", "step": step, "time": 1.0,
           "metrics": {f"m{i}": float(i) for i in range(numbers)}}
    return json.dumps(rec).encode()


def _settings() -> Settings:
    return Settings(max_values_per_request=LIMIT)


def test_the_values_budget_refuses_on_the_line_that_passes_it_with_the_exact_count():
    lines = [_line(k, 150) for k in range(10)]
    counts = [count_values(line) for line in lines]
    over = next(i for i in range(len(lines)) if sum(counts[: i + 1]) > LIMIT)
    with pytest.raises(BadRequest) as caught:
        decode(b"\n".join(lines), NDJSON, _settings())
    assert caught.value.status == 413
    assert f"body holds about {sum(counts[: over + 1])} JSON values" in caught.value.reason
    # The lines before it fit the budget: one fewer line is no 413.
    objs = decode(b"\n".join(lines[:over]), NDJSON, _settings())
    assert len(objs) == over and all(isinstance(o, Line) for o in objs)


def test_many_bytes_of_few_values_are_not_refused():
    # Each line is ~5x the whole values budget in bytes, and holds a handful of values.
    pad = "x" * (5 * LIMIT)
    lines = [json.dumps({"kind": "step", "run_id": "r", "step": k, "time": 1.0,
                         "note": pad}).encode() for k in range(20)]
    assert sum(map(len, lines)) > 50 * LIMIT
    objs = decode(b"\n".join(lines), NDJSON, _settings())
    assert [o.obj["step"] for o in objs] == list(range(20))
