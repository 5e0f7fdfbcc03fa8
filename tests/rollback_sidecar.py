"""A sidecar on loopback whose one rule rolls a run back on NaN, the records door it is fed
through, and the records (run ``r``'s steps and saves at data positions): shared by the
rollback tests that read a plan back over real HTTP."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from monitor_agent.settings import load_settings
from tests.live_server import LiveServer

RULE = """
routes: {page: [console]}
rules:
  - name: RollbackOnNaN
    match: {types: [nan_inf]}
    severity: critical
    fingerprint: []
    action: rollback
"""


@contextmanager
def rollback_sidecar(tmp_path: Path, **knobs: int) -> Iterator[LiveServer]:
    """The sidecar, its rule given ``knobs`` (``rollback_skip_margin``, ...)."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULE + "".join(f"    {k}: {v}\n" for k, v in knobs.items()))
    settings = load_settings(data_dir=tmp_path / "data", alerting={
        "rules_file": str(rules), "group_wait_seconds": 0.05})
    with LiveServer(settings) as srv:
        yield srv


def post(srv: LiveServer, records: list[dict[str, Any]]) -> dict[str, Any]:
    r = httpx.post(srv.url + "/v1/records", json={"records": records}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def step(step: int, position: int, attempt: str, loss: float | str = 2.0) -> dict[str, Any]:
    """Run ``r``'s step ``step`` of ``attempt``, its data consumed to ``position``."""
    return {"kind": "step", "run_id": "r", "step": step, "time": 1000.0 + step, "loss": loss,
            "grad_norm": 1.0, "data_position": position, "attempt": attempt}


def save(step: int, position: int, attempt: str) -> dict[str, Any]:
    """Run ``r``'s checkpoint after step ``step``, resuming at ``position``."""
    return {"kind": "checkpoint", "run_id": "r", "step": step, "time": 1000.5 + step,
            "path": f"/ckpt/{step}.pt", "attempt": attempt, "data_position": position}
