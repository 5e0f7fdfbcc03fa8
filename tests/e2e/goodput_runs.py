"""The goodput e2e's runs of its user-style script (``goodput_train.py``, the real client),
and what they are measured by: the script's own clock and the sidecar's answers. Shared by
``tests/e2e/test_goodput_faults.py``, which holds the ledger to them, and
``bench/goodput_faults.py``, which prints the figures."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("goodput_train.py")
STRAGGLER_CAUSES = ("straggler_data", "straggler_compute", "straggler_collective")


def launch(script: Path, out: Path, *args: str, world: int = 1,
            env_of: Any = None) -> list[subprocess.CompletedProcess[str]]:
    """The script as ``world`` processes (gloo ranks on loopback when more than one);
    ``env_of(rank)``: more environment for a rank (its node's sidecar)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'client'}:{REPO}", "OMP_NUM_THREADS": "1",
           "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "MONITOR_AGENT_SPOOL_DIR": str(out / "spool")}
    procs = [subprocess.Popen([sys.executable, str(script), *args],
                              env={**env, "RANK": str(rank),
                                   **(env_of(rank) if env_of else {})},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(world)]
    done = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=240)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def train_script(url: str | None, run_id: str, out: Path, *args: str, world: int = 1,
           ok: bool = True, env_of: Any = None) -> list[subprocess.CompletedProcess[str]]:
    where = ["--url", url] if url else []
    procs = launch(SCRIPT, out, *where, "--run-id", run_id, "--out-dir", str(out), *args,
                    world=world, env_of=env_of)
    if ok:
        assert all(p.returncode == 0 for p in procs), [p.stderr[-3000:] for p in procs]
    return procs


def script_clock(out: Path, rank: int | str = 0) -> list[dict[str, Any]]:
    """The scripts' own clock (every process of ``rank``, ``"*"``: of every rank), in time
    order."""
    events = [json.loads(line) for f in out.glob(f"clock-r{rank}-*.jsonl")
              for line in f.read_text().splitlines()]
    return sorted(events, key=lambda e: e["time"])


def step_waits(clock: list[dict[str, Any]]) -> list[float]:
    """The seconds the script waited for each step's batch, by its own clock, in order."""
    return [e["wait"] for e in clock if e["event"] == "step"]


def goodput_of(url: str, run_id: str) -> dict[str, Any]:
    r = httpx.get(f"{url}/v1/runs/{run_id}/goodput", timeout=10)
    r.raise_for_status()
    return r.json()


def findings_of(url: str, run_id: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{url}/v1/runs/{run_id}/findings", params={"limit": 10_000}, timeout=10)
    r.raise_for_status()
    return r.json()["findings"]
