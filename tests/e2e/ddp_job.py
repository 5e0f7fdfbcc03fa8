"""A 4-process DDP job of the user-style script ``ddp_rank_fault_train.py`` (gloo on
loopback, one process per rank as torchrun starts them, the real client in each), shared by
``tests/e2e/test_rank_faults.py`` and ``bench/rank_faults.py``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.sidecar_process import REPO, free_port

SCRIPT = Path(__file__).with_name("ddp_rank_fault_train.py")
WORLD = 4


def ddp_job(url: str, run_id: str, *flags: str) -> None:
    """The four ranks, started as torchrun would; each must exit cleanly."""
    port = free_port()
    procs = []
    for rank in range(WORLD):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(WORLD),
               "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
               "NODE_NAME": f"gpu-node-{rank}", "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join([str(REPO / "client"), str(REPO),
                                              os.environ.get("PYTHONPATH", "")])}
        procs.append(subprocess.Popen(
            [sys.executable, str(SCRIPT), "--url", url, "--run-id", run_id, *flags],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        out, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, out
