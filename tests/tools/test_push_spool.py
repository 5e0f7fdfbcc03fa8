"""A spool left behind is found by its run id, sent later with ``monitor-agent push-spool``
and pages as if it had arrived on time; a healthy run leaves no spool directory behind.
Real client, real sidecar subprocess, the real CLI."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import httpx

from monitor_client import Monitor, MonitorSettings
from tests.eventually import eventually

REPO = Path(__file__).resolve().parents[2]


def _monitor(url: str, spool: Path, run_id: str, token: str | None = None) -> Monitor:
    return Monitor(url=url, run_id=run_id, token=token, settings=MonitorSettings(
        install_hooks=False, spool_dir=spool, linger=0.02, close_timeout=0.5,
        timeout=(0.3, 1.0)))


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), str(REPO / "client"), os.environ.get("PYTHONPATH", "")])}
    env.pop("MONITOR_AGENT_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "monitor_agent", *args], capture_output=True,
                          text=True, timeout=120, env=env, cwd=REPO)


def _alert_types(url: str, run_id: str) -> set[str]:
    """The types of the run's alerts, once it has any."""
    return eventually(lambda: {a.get("type") for a in httpx.get(
        f"{url}/v1/alerts", params={"run_id": run_id}, timeout=5).json()["alerts"]},
        timeout=15, interval=0.1, what=f"an alert of {run_id}")


def test_a_spool_left_while_the_sidecar_was_down_is_pushed_later_and_pages(
        sidecar_factory, tmp_path, caplog):
    sidecar = sidecar_factory()  # not started: the sidecar is down for the whole run
    spool = tmp_path / "spool"
    caplog.set_level(logging.WARNING, logger="monitor_client")
    mon = _monitor(sidecar.url, spool, "gpt-exp-1")
    for step in range(1, 7):
        mon.log_step(step, loss=float("nan") if step == 5 else 2.0 - 0.01 * step)
    assert mon.close() is False
    run_dir = spool / "gpt-exp-1-r0"  # the run id as the user wrote it
    assert sorted(p.suffix for p in run_dir.iterdir()) and all(
        p.suffix == ".ndjson" for p in run_dir.iterdir())
    said = caplog.text
    assert "run 'gpt-exp-1' rank 0" in said and f"push-spool {run_dir}" in said

    sidecar.start()
    proc = _cli("push-spool", str(spool), "--url", sidecar.url)
    assert proc.returncode == 0, proc.stderr
    assert "(run gpt-exp-1)" in proc.stdout and "0 refused" in proc.stdout
    assert "spool removed" in proc.stdout and not run_dir.exists()
    steps = {r["step"]: r for r in sidecar.records("gpt-exp-1") if r["kind"] == "step"}
    assert sorted(steps) == [1, 2, 3, 4, 5, 6] and steps[5]["loss"] == "NaN"
    assert "nan_inf" in _alert_types(sidecar.url, "gpt-exp-1")

    again = _cli("push-spool", str(run_dir), "--url", sidecar.url)
    assert again.returncode == 1 and "no such spool directory" in again.stderr


def test_a_refusing_sidecar_deletes_nothing(sidecar_factory, tmp_path):
    sidecar = sidecar_factory(env={"MONITOR_AGENT_TOKEN": "the-right-token-0123456789"})
    spool = tmp_path / "spool"
    mon = _monitor(sidecar.url, spool, "needs-token")
    for step in range(1, 4):
        mon.log_step(step, loss=1.0)
    mon.close()
    files = sorted((spool / "needs-token-r0").iterdir())
    assert files
    sidecar.start()
    proc = _cli("push-spool", str(spool), "--url", sidecar.url)
    assert proc.returncode == 1 and "401" in proc.stderr and "Traceback" not in proc.stderr
    assert sorted((spool / "needs-token-r0").iterdir()) == files  # kept, to push again
    proc = _cli("push-spool", str(spool), "--url", sidecar.url,
                "--token", "the-right-token-0123456789")
    assert proc.returncode == 0, proc.stderr
    assert "5 records" in proc.stdout and "5 accepted" in proc.stdout  # run, 3 steps, end


def test_a_delivered_run_leaves_no_spool_directory(sidecar, tmp_path):
    spool = tmp_path / "spool"
    mon = _monitor(sidecar.url, spool, "healthy")
    for step in range(1, 6):
        mon.log_step(step, loss=1.0)
    assert mon.close(timeout=10) is True
    assert not spool.exists() or list(spool.iterdir()) == []
