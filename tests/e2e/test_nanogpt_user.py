"""What a new user meets instrumenting a nanoGPT-style script from the README alone.

``nanogpt_user_train.py`` is written as karpathy's nanoGPT is (config globals, ``--key=val``
overrides, ``grad_clip = 0.0`` for "disabled", ``max_iters``), with the README's lines added.
Each test runs it as a user would, a subprocess against a real sidecar, and checks what
the user sees: the sidecar's answers and the script's own output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("nanogpt_user_train.py")


def train(sidecar, tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MONITOR_AGENT_URL": sidecar.url, "OMP_NUM_THREADS": "1",
           "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "client"), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(SCRIPT), *overrides], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_grad_clip_zero_is_no_clipping_and_total_steps_gives_progress(sidecar, tmp_path):
    proc = train(sidecar, tmp_path, "--run_id=nano-plain")
    assert "monitor_client" not in proc.stderr, proc.stderr  # nothing to warn about
    records = sidecar.records("nano-plain")
    run = next(r for r in records if r["kind"] == "run")
    assert run["config"]["grad_clip"] == 0.0 and run["config"]["total_steps"] == 120
    steps = [r for r in records if r["kind"] == "step"]
    assert len(steps) == 120 and all(r.get("clip_threshold") is None for r in steps)
    # the script's own scalar, passed as a keyword as a wandb.log user would, is charted
    assert all(r["metrics"]["iter_ms"] > 0 for r in steps)
    series = _eventually(lambda: httpx.get(f"{sidecar.url}/v1/runs/nano-plain/series",
                                           timeout=10).json(), lambda s: s.get("user_names"))
    assert series["user_names"] == ["iter_ms"] and series["user_scalars"]["iter_ms"]["steps"]
    detail = httpx.get(f"{sidecar.url}/v1/runs/nano-plain", timeout=10).json()
    assert detail["ranks"]["0"]["progress_ratio"] == 1.0
    assert detail["ranks"]["0"]["progress_basis"] == "steps"


def _eventually(get, ok, timeout: float = 15.0):
    """What ``get`` answers once ``ok`` holds (the chart history folds on its own thread)."""
    deadline = time.monotonic() + timeout
    while True:
        found = get()
        if ok(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)
