"""Where a hung script is stuck, as the page says it (issue 45 point 9): the stuck frame
with its line, and the script's own frame it was called from, also for a script that has
no file (``python -c``, ``exec``). A real sidecar, the real client in a subprocess run as a
user runs it; the script waits (for a file the test writes) in the way named.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import httpx

from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]

# Trains a few steps, then waits in train() until RELEASE exists: with a plain sleep
# (WAIT = "sleep": the innermost Python frame is train's own line) or on a
# threading.Event (WAIT = "event": the innermost Python frame is threading.py's wait).
SCRIPT = textwrap.dedent('''\
    import os, sys, threading, time
    import torch
    import monitor_client
    from monitor_client import MonitorSettings

    RUN_ID, WAIT, RELEASE = sys.argv[1], sys.argv[2], sys.argv[3]


    def train():
        model = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        mon = monitor_client.Monitor(project="hang-where", run_id=RUN_ID,
                                     settings=MonitorSettings(watchdog_floor=0.5, linger=0.05))
        mon.watch(model, opt)
        for step in range(1, 9):
            if step == 7:
                while not os.path.exists(RELEASE):
                    if WAIT == "sleep":
                        time.sleep(0.5)  # SLEEP LINE
                    else:
                        threading.Event().wait(0.5)
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            mon.log_step(step, loss=1.0)
        mon.close()


    train()  # CALL LINE
''')
SLEEP_LINE = SCRIPT.splitlines().index(next(
    line for line in SCRIPT.splitlines() if "# SLEEP LINE" in line)) + 1
CALL_LINE = SCRIPT.splitlines().index("train()  # CALL LINE") + 1
CONFIG = "tick_interval_seconds: 0.2\n"


def _start(sidecar, tmp_path: Path, run_id: str, wait: str, *, as_file: bool):
    env = {**os.environ, "MONITOR_AGENT_URL": sidecar.url, "OMP_NUM_THREADS": "1",
           "MONITOR_AGENT_SPOOL_DIR": str(tmp_path / "spool"),
           "PYTHONPATH": os.pathsep.join([str(REPO / "client"), os.environ.get("PYTHONPATH", "")])}
    release = tmp_path / f"release-{run_id}"
    if as_file:
        (tmp_path / "main.py").write_text(SCRIPT)
        argv = [sys.executable, "main.py"]
    else:
        argv = [sys.executable, "-c", SCRIPT]
    proc = subprocess.Popen([*argv, run_id, wait, str(release)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, release


def _hang_message(sidecar, run_id: str) -> str:
    def found() -> str:
        findings = httpx.get(f"{sidecar.url}/v1/runs/{run_id}/findings",
                             timeout=10).json()["findings"]
        hangs = [f for f in findings if f["type"] == "hang"]
        assert hangs, findings
        return hangs[-1]["message"]

    return eventually(found, timeout=120, interval=0.2, what="the hang finding")


def _finish(proc, release: Path) -> None:
    release.write_text("go")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]


def test_a_script_stuck_in_its_own_line_is_named_with_that_line(sidecar_factory, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    sc = sidecar_factory(config=config).start()
    proc, release = _start(sc, tmp_path, "hang-file", "sleep", as_file=True)
    try:
        message = _hang_message(sc, "hang-file")
    finally:
        _finish(proc, release)
    assert message.startswith("rank 0 stuck ") and (
        f"s in main.py:train at line {SLEEP_LINE}, called from main.py:{CALL_LINE} "
        "(last completed step 6)") in message, message


def test_a_script_run_with_python_c_still_has_its_frame_named(sidecar_factory, tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(CONFIG)
    sc = sidecar_factory(config=config).start()
    proc, release = _start(sc, tmp_path, "hang-c", "event", as_file=False)
    try:
        message = _hang_message(sc, "hang-c")
    finally:
        _finish(proc, release)
    # the innermost frame is threading's; the script's own is the one called from
    assert "s in threading.py:wait at line " in message, message
    assert f", called from <string>:{SLEEP_LINE + 2} " in message, message
