"""The records a job's clients send a sidecar, for the restart and exclusion tests: run
records that declare a launcher, steps on the run's own clock, checkpoints, hang reports,
and a sidecar in this process with a Slack-protocol receiver and a rules file.

A job is ``ranks`` ranks, ``per_node`` to a node; each rank's records carry its own attempt
token (``token(rank, attempt)``), as each process draws one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from monitor_agent.serving.embedded import EmbeddedServer, free_port
from monitor_agent.settings import Settings
from tests.receivers import Receiver

RUN = "heal"
TORCHRUN = {"name": "torchrun", "restarts": True, "restart_count": 0, "max_restarts": 3}
RESTART_RULES = """
routes: {page: [slack]}
rules:
  - {name: RestartOnHang, match: {types: [hang]}, severity: critical, fingerprint: [],
     cooldown: 30m, resolve_after: 3s, action: restart}
  - {name: RestartOnGpuFault, match: {types: [gpu_health], min_severity: critical}, severity: critical,
     fingerprint: [rank], cooldown: 10m, resolve_after: 3s, action: restart}
  - {name: RollbackOnNaN, match: {types: [nan_inf]}, severity: critical, fingerprint: [],
     cooldown: 60s, action: rollback, rollback_skip_margin: 5}
"""


def token(rank: int, attempt: int = 1) -> str:
    return f"a{attempt}r{rank}"


@contextmanager
def sidecar(tmp: Path, slack: Receiver, rules: str = RESTART_RULES, port: int | None = None,
            quiet: float = 10.0, **cluster: Any) -> Iterator[EmbeddedServer]:
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "rules.yaml").write_text(rules)
    settings = Settings(
        port=port or free_port(), data_dir=tmp, tick_interval_seconds=0.1,
        attempt_quiet_seconds=quiet,
        detectors={"hang_settle_seconds": 0.5, "hang_repeat_seconds": 1.0},
        alerting={"rules_file": str(tmp / "rules.yaml"), "group_wait_seconds": 0.05,
                  "slack": {"webhook_url": slack.url + "/hook", "min_interval_seconds": 0}},
        cluster={"peer_timeout_seconds": 2.0, "heartbeat_seconds": 0.2, **cluster})
    with EmbeddedServer(settings) as srv:
        yield srv


def post(url: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    resp = httpx.post(url + "/v1/records", content=json.dumps({"records": records}),
                      headers={"content-type": "application/json"}, timeout=10)
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    assert not body["rejected"], body["rejected"]
    return body


def run_record(rank: int, ranks: int, attempt: int = 1, per_node: int | None = None,
               launcher: dict[str, Any] | None = None, leader: str | None = None,
               nodes: int | None = None, watchdog_floor: float = 1.0) -> dict[str, Any]:
    record: dict[str, Any] = {
        "kind": "run", "run_id": RUN, "rank": rank, "time": time.time(),
        "attempt": token(rank, attempt),
        "hardware": {"reporting_ranks": ranks, "world_size": ranks},
        "watchdog": {"floor_seconds": watchdog_floor, "factor": 5.0},
        "launcher": TORCHRUN if launcher is None else launcher}
    if per_node is not None:
        node = rank // per_node
        record["labels"] = {"hostname": f"gpu-node-{node}"}
        record["cluster"] = {"node_rank": node, "nodes": nodes or -(-ranks // per_node),
                             "local_world_size": per_node, "leader_url": leader}
    return record


def step(rank: int, step: int, attempt: int = 1, **fields: Any) -> dict[str, Any]:
    return {"kind": "step", "run_id": RUN, "rank": rank, "step": step, "time": time.time(),
            "attempt": token(rank, attempt), "loss": 2.0, "data_position": step, **fields}


def checkpoint(step: int, attempt: int = 1, rank: int = 0) -> dict[str, Any]:
    return {"kind": "checkpoint", "run_id": RUN, "rank": rank, "step": step,
            "time": time.time(), "path": f"/ckpt/step-{step}.pt",
            "attempt": token(rank, attempt), "data_position": step}


def hang(rank: int, step: int, attempt: int = 1, phase: str = "backward",
         frame: str = "all_reduce") -> dict[str, Any]:
    frames = [{"file": "train.py", "line": 40, "function": "main", "user": True},
              {"file": "torch/distributed/distributed_c10d.py", "line": 3252,
               "function": frame, "user": False}]
    return {"kind": "hang", "run_id": RUN, "rank": rank, "step": step, "time": time.time(),
            "attempt": token(rank, attempt), "stuck_seconds": 1.5, "limit_seconds": 1.0,
            "phase": phase, "threads": [{"name": "MainThread", "training": True,
                                         "frames": frames}]}


def actions(url: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = httpx.get(f"{url}/v1/runs/{RUN}/actions",
                                          timeout=10).json()["actions"]
    return got


def texts(slack: Receiver) -> list[str]:
    return [r.json["text"] for r in slack.requests if isinstance(r.json, dict)]
