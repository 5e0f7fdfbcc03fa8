"""A rollback's page says how the run leaves its windows out, as its run record declared
(``data.skips_by``, docs/format.md): a map-style dataset in its sampler, a stream by reading
past them; a run that did not say gets the plain sentence. Over real HTTP (issue 49)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.rollback_sidecar import post, rollback_sidecar


def _step(run: str, step: int, loss: float | str = 2.0) -> dict[str, Any]:
    return {"kind": "step", "run_id": run, "step": step, "time": 1000.0 + step, "loss": loss,
            "grad_norm": 1.0, "data_position": step, "attempt": "a"}


@pytest.mark.parametrize("data,said", [
    ({"skips_by": "sampler"}, "skipping batches 11-24, left out in the sampler (never loaded)"),
    ({"skips_by": "reading"}, "skipping batches 11-24 by reading past them (streamed data)"),
    (None, "skipping batches 11-24")])
def test_the_plan_says_how_the_run_skips(tmp_path: Path, data, said):
    run = {"kind": "run", "run_id": "r", "time": 1000.0, "attempt": "a"}
    with rollback_sidecar(tmp_path, rollback_skip_margin=3) as srv:
        post(srv, [{**run, **({"data": data} if data else {})},
                    *(_step("r", s) for s in range(1, 21)),
                    {"kind": "checkpoint", "run_id": "r", "step": 10, "time": 1010.5,
                     "path": "/ckpt/10.pt", "attempt": "a", "data_position": 10}])
        [plan] = post(srv, [_step("r", 21, "NaN")])["actions"]
        assert plan["message"].endswith(said), plan["message"]
        assert plan["plan"].get("skips_by") == (data or {}).get("skips_by")
        bad = httpx.post(srv.url + "/v1/records", json={"records": [
            {**run, "data": {"skips_by": "somehow"}}]}, timeout=30)
        assert bad.status_code == 422 and "skips_by" in bad.text
