"""Issue 31: a run whose process is killed (SIGKILL, as the OOM killer does: nothing runs,
no end record) is not left "running · 2 min left": once nothing has come from it
for longer than its stall limit, its page says it went silent and its process most likely
died, and no ETA is given; a record arriving later makes it running again. A real client
subprocess, a real sidecar."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import sys, time
import monitor_client
mon = monitor_client.Monitor(run_id=sys.argv[1], total_steps=10_000)
for step in range(1, 10_001):
    mon.log_step(step, loss=2.0)
    time.sleep(0.05)  # a step's pace, until the test kills it
"""


def _detail(url: str, run_id: str) -> dict:
    return httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()


def test_a_killed_run_is_marked_silent_after_its_stall_limit(tmp_path, sidecar_factory):
    config = tmp_path / "config.yaml"
    config.write_text("detectors: {stall_min_seconds: 2, stall_factor: 5}\n")
    sc = sidecar_factory(config=config).start()
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO / "client"), "MONITOR_AGENT_URL": sc.url,
           "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool")}
    proc = subprocess.Popen([sys.executable, str(script), "killed"], env=env)
    try:
        eventually(lambda: (_detail(sc.url, "killed").get("last_step") or 0) >= 30,
                   timeout=30, what="step 30 stored")
        running = _detail(sc.url, "killed")
        assert running["phase"] == "running" and "eta_seconds" in running["ranks"]["0"]
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        proc.kill()
    silent = eventually(lambda: (d := _detail(sc.url, "killed"))["phase"].startswith("silent")
                        and d, timeout=30, what="the run marked silent")
    assert silent, _detail(sc.url, "killed")
    assert silent["status"] == "running"
    assert silent["phase"].startswith(f"silent since step {silent['last_step']}: nothing for "
                                      "over "), silent["phase"]
    assert "its process most likely died" in silent["phase"]
    assert "eta_seconds" not in silent["ranks"]["0"]  # a dead process has no time left
    # A record after all (a relaunch resuming it): the run is heard from again.
    late = {"kind": "step", "run_id": "killed", "step": silent["last_step"] + 1,
            "time": time.time(), "loss": 2.0}
    assert sc.post([late]).status_code == 200
    eventually(lambda: _detail(sc.url, "killed")["phase"] == "running", timeout=30,
               what="the run running again")
